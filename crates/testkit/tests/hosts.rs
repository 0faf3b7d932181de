//! The namespace hosts themselves: each answers ssh with the test's key, in its own network
//! namespace, reaches the others across the bridge, and nothing of them is left once dropped.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Command;

use kvlab_testkit::hosts::NetnsHosts;

fn ssh(hosts: &NetnsHosts, i: usize, script: &str) -> String {
    let out = Command::new("ssh")
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .arg("-o")
        .arg(format!(
            "UserKnownHostsFile={}",
            hosts.known_hosts().display()
        ))
        .arg("-i")
        .arg(hosts.identity())
        .arg(hosts.ssh_target(i))
        .arg(script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh {}: {script}: {}",
        hosts.ssh_target(i),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn namespace_hosts_answer_ssh_each_in_its_namespace_and_go_away() {
    let Some(hosts) = NetnsHosts::for_test("namespace_hosts", 2) else {
        return;
    };
    let names: Vec<String> = hosts.hosts().iter().map(|h| h.name.clone()).collect();
    for i in 0..2 {
        let ns = ssh(&hosts, i, "readlink /proc/self/ns/net");
        assert_eq!(
            ns.trim(),
            format!("net:[{}]", hosts.netns_inode(i).unwrap()),
            "host {i}'s session runs in its namespace"
        );
        assert_eq!(
            hosts.listening(i),
            vec![22],
            "only sshd listens on host {i}"
        );
    }
    // Host 1 reaches host 2's sshd across the bridge.
    let other = hosts.hosts()[1].addr;
    let banner = ssh(
        &hosts,
        0,
        &format!("exec 3<>/dev/tcp/{other}/22; read -r -t 2 line <&3; echo \"$line\""),
    );
    assert!(banner.starts_with("SSH-2.0-"), "{banner}");
    hosts.down().unwrap();
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    for name in names {
        assert!(!left.contains(&name), "namespace {name} left: {left}");
    }
}
