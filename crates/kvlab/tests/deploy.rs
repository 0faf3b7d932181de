//! The Kubernetes manifests' init step (`deploy/k8s/kvlab.yaml`, the node pods'
//! `create-cluster` container) run for real: its shell script, taken from the manifest,
//! against a real etcd and this build's `kvlab`. The first pod creates the ring of the
//! initial nodes under their stable DNS names, with the ConfigMap's copies of every key;
//! the next ones find it made; with etcd
//! unreachable the step fails (and the kubelet retries it). The manifests' schemas and
//! cross-references are `deploy/check.sh`'s (run by `.ci/run`).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Command, Output};

use kvlab_etcd::open_store;
use kvlab_process::free_ports;
use kvlab_process::Etcd;

const KVLAB: &str = env!("CARGO_BIN_EXE_kvlab");

/// The init container's script, read from the manifest with PyYAML (which the manifest
/// validator installs with itself).
fn init_script() -> String {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/k8s/kvlab.yaml");
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, yaml\n\
             docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]\n\
             sts = next(d for d in docs if d['kind'] == 'StatefulSet')\n\
             init = next(c for c in sts['spec']['template']['spec']['initContainers'] \
                         if c['name'] == 'create-cluster')\n\
             assert init['command'][:2] == ['/bin/sh', '-c'], init['command']\n\
             sys.stdout.write(init['command'][2])\n",
        )
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reading the init script (python3 with PyYAML; .ci/run installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the script as the pod would: `kvlab` on PATH, the ConfigMap's and the downward
/// API's variables in the environment, nothing else.
fn run_init(script: &str, bin: &Path, topology: &str) -> Output {
    Command::new("timeout")
        .arg("60")
        .args(["/bin/sh", "-c", script])
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("KVLAB_TOPOLOGY", topology)
        .env("KVLAB_INITIAL_NODES", "3")
        .env("KVLAB_REPLICAS", "2")
        .env("POD_NAMESPACE", "cache")
        .output()
        .unwrap()
}

#[test]
fn the_init_step_creates_the_ring_once_under_the_pods_stable_names() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd")).expect("etcd starts (.ci/run installs it)");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(KVLAB, bin.join("kvlab")).unwrap();
    let script = init_script();
    let spec = etcd.spec("kvlab");

    let first = run_init(&script, &bin, &spec);
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success() && text.contains("cluster created"),
        "first pod: {text}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let t = open_store(&spec).unwrap().load().unwrap().unwrap();
    assert_eq!(t.replicas, 2);
    assert_eq!(
        t.nodes,
        vec![
            "kvlab-0.kvlab.cache.svc:11211",
            "kvlab-1.kvlab.cache.svc:11211",
            "kvlab-2.kvlab.cache.svc:11211"
        ]
    );

    // The other pods (and a restarted one) find the ring made and leave it as it is.
    let again = run_init(&script, &bin, &spec);
    assert!(
        again.status.success()
            && String::from_utf8_lossy(&again.stdout).contains("the cluster exists"),
        "second pod: {}{}",
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&again.stderr)
    );
    let t2 = open_store(&spec).unwrap().load().unwrap().unwrap();
    assert_eq!((t2.epoch, t2.nodes), (t.epoch, t.nodes));

    // etcd not reachable: the step fails, so the node does not start without a ring.
    let nowhere = format!("etcd://127.0.0.1:{}/kvlab", free_ports(1).unwrap()[0]);
    let failed = run_init(&script, &bin, &nowhere);
    assert!(
        !failed.status.success(),
        "succeeded without etcd: {}",
        String::from_utf8_lossy(&failed.stdout)
    );
}
