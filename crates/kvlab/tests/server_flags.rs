//! memcached's command-line flags that scripts pass to `memcached` are accepted by `kvlab
//! server` with memcached's meaning (`-u`, `-C`, `-F`, `-R`, `-B`; shown in `stats
//! settings`) or as documented no-ops shown there (`-o modern|no_modern`, `-o
//! read_buf_mem_limit`), and bad values are refused with memcached's words.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use kvlab_process::{free_port, Probe, Spawn};

fn exchange(addr: SocketAddr, req: &[u8], until: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(req).expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while !got.ends_with(until) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

#[test]
fn memcached_flags_start_the_server_with_their_meanings() {
    let port = free_port().expect("free port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let server = Spawn::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["server", "-p", &port.to_string(), "-t", "1"])
        .args(["-u", "nobody", "-R", "5", "-B", "ascii", "-C", "-F"])
        .args(["-o", "modern,read_buf_mem_limit=4"])
        .ready(Probe::Version(addr))
        .timeout(Duration::from_secs(20))
        .start()
        .expect("kvlab server starts with memcached's flags");
    let settings = exchange(addr, b"stats settings\r\n", b"END\r\n");
    for line in [
        "STAT reqs_per_event 5\r\n",
        "STAT binding_protocol ascii\r\n",
        "STAT cas_enabled no\r\n",
        "STAT flush_enabled no\r\n",
        "STAT read_buf_mem_limit 4194304\r\n",
    ] {
        assert!(settings.contains(line), "{line:?} not in\n{settings}");
    }
    // -F: memcached's refusal (noreply silences it); -C: CAS values 0, no compare matches.
    assert_eq!(
        exchange(
            addr,
            b"flush_all\r\nflush_all noreply\r\nset k 0 0 1\r\nx\r\ngets k\r\ncas k 0 0 1 0\r\ny\r\ncas n 0 0 1 0\r\ny\r\n",
            b"NOT_FOUND\r\n"
        ),
        "CLIENT_ERROR flush_all not allowed\r\nSTORED\r\nVALUE k 0 1 0\r\nx\r\nEND\r\nEXISTS\r\nNOT_FOUND\r\n"
    );
    if is_root() {
        // -u as root: the server runs as `nobody`.
        let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid()))
            .expect("server status");
        let uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string));
        assert_eq!(uid.as_deref(), Some("65534"), "{status}");
    }
    server.stop();

    // -o no_modern: memcached 1.4's defaults that kvlab has (no crawler, no slab reassign).
    let port = free_port().expect("free port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let server = Spawn::new(env!("CARGO_BIN_EXE_kvlab"))
        .args([
            "server",
            "-p",
            &port.to_string(),
            "-t",
            "1",
            "-o",
            "no_modern",
            "-B",
            "auto",
        ])
        .ready(Probe::Version(addr))
        .timeout(Duration::from_secs(20))
        .start()
        .expect("kvlab server starts with -o no_modern");
    let settings = exchange(addr, b"stats settings\r\n", b"END\r\n");
    assert!(settings.contains("STAT slab_reassign no\r\n"), "{settings}");
    assert!(
        settings.contains("STAT binding_protocol auto-negotiate\r\n"),
        "{settings}"
    );
    server.stop();
}

#[test]
fn bad_values_are_refused_with_memcached_s_words() {
    let refuse = |args: &[&str], words: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kvlab"))
            .args(["server", "-p", "0"])
            .args(args)
            .output()
            .expect("kvlab runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(words), "{args:?}: {err}");
    };
    refuse(
        &["-R", "0"],
        "Number of requests per event must be greater than 0",
    );
    refuse(&["-B", "bogus"], "bogus");
    // A server that could store nothing, or serve no one, is refused as memcached does.
    refuse(
        &["-m", "0"],
        "Cannot set item size limit higher than 1/2 of memory max.",
    );
    refuse(&["-c", "0"], "Maximum connections must be greater than 0");
    refuse(
        &["-o", "read_buf_mem_limit=x"],
        "could not parse argument to read_buf_mem_limit",
    );
    if is_root() {
        refuse(
            &["-u", "kvlab-no-such-user"],
            "can't find the user kvlab-no-such-user to switch to",
        );
    }
}

/// Sends `req` and reads until `n` replies ending in `until` arrived.
fn exchange_n(s: &mut TcpStream, req: &[u8], until: &str, n: usize) -> String {
    s.write_all(req).expect("write");
    let mut got = String::new();
    let mut buf = [0u8; 65536];
    while got.matches(until).count() < n {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.push_str(&String::from_utf8_lossy(&buf[..k])),
        }
    }
    got
}

fn stat(stats: &str, name: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {stats}"))
}

/// `--cache-items N` bounds the cache by entries beside `-m`, under every eviction policy
/// (`curr_items` in `stats`); over `--data-dir` the keys it pushes out are read back from
/// disk.
#[test]
fn cache_items_bounds_the_items_under_every_policy() {
    for (policy, durable) in [
        ("fifo", false),
        ("lru", false),
        ("lfu", false),
        ("lru", true),
        ("fifo", true),
    ] {
        let port = free_port().expect("free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = vec![
            "server".to_string(),
            "-p".into(),
            port.to_string(),
            "-l".into(),
            "127.0.0.1".into(),
            "-t".into(),
            "1".into(),
            "--cache-items".into(),
            "100".into(),
            "--eviction".into(),
            policy.into(),
        ];
        if durable {
            args.extend(["--data-dir".into(), dir.path().display().to_string()]);
        }
        let server = Spawn::new(env!("CARGO_BIN_EXE_kvlab"))
            .args(&args)
            .ready(Probe::Version(addr))
            .timeout(Duration::from_secs(20))
            .start()
            .expect("kvlab server starts with --cache-items");
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        for batch in 0..10 {
            let mut req = Vec::new();
            for i in batch * 100..(batch + 1) * 100 {
                req.extend_from_slice(format!("set k{i} 0 0 5\r\nv{i:04}\r\n").as_bytes());
            }
            let got = exchange_n(&mut s, &req, "STORED\r\n", 100);
            assert_eq!(got.matches("STORED\r\n").count(), 100, "{policy}: {got}");
            let stats = exchange_n(&mut s, b"stats\r\n", "END\r\n", 1);
            let items = stat(&stats, "curr_items");
            assert!(
                items <= 100,
                "{policy}: {items} items over --cache-items 100"
            );
        }
        let stats = exchange_n(&mut s, b"stats\r\n", "END\r\n", 1);
        assert_eq!(stat(&stats, "curr_items"), 100, "{policy}");
        assert_eq!(stat(&stats, "evictions"), 900, "{policy}");
        if durable {
            // Every key comes back from disk, and reading them keeps the bound.
            for i in 0..1000 {
                let got = exchange_n(&mut s, format!("get k{i}\r\n").as_bytes(), "END\r\n", 1);
                assert!(got.contains(&format!("v{i:04}")), "{policy}: k{i}: {got}");
            }
            let stats = exchange_n(&mut s, b"stats\r\n", "END\r\n", 1);
            let items = stat(&stats, "curr_items");
            assert!(items <= 100, "{policy}: {items} items after reading");
        }
        server.stop();
    }
}

/// Waits (bounded) until `f` holds.
/// Reads `child`'s stderr on a thread of its own (so the server never blocks on a full
/// pipe) and returns its lines as they come.
fn stderr_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().expect("stderr piped");
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(err)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The lines `lines` gives until one says the server listens (at most 15 s), that line
/// included.
fn until_listening(lines: &std::sync::mpsc::Receiver<String>) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut said = String::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no \"listening on\" in 15 s ({e}); said:\n{said}"));
        said.push_str(&line);
        said.push('\n');
        if line.contains(" listening on ") {
            return said;
        }
    }
}

/// Waits (a pidfd, at most 15 s) for the process `pid`, not a child of this one, to exit.
fn until_gone(pid: i32) {
    // SAFETY: pidfd_open(2) and poll(2) on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        if fd < 0 {
            return; // gone already
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ready = libc::poll(&mut p, 1, 15_000);
        libc::close(fd);
        assert_eq!(ready, 1, "process {pid} still running 15 s after SIGTERM");
    }
}

/// `-d -P FILE`: the command returns once the server listens, the server goes on in a
/// session of its own with its pid in FILE, and the file goes when the server stops. A
/// daemon that cannot listen fails the command.
#[test]
fn a_daemon_detaches_answers_and_takes_its_pidfile_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("kvlab.pid");
    let port = free_port().expect("free port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let out = Command::new("timeout")
        .args(["30", env!("CARGO_BIN_EXE_kvlab"), "server", "-d", "-t", "1"])
        .args(["-p", &port.to_string(), "-P"])
        .arg(&pid_file)
        .output()
        .expect("kvlab runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("the pid file is written once the server listens")
        .trim()
        .parse()
        .expect("a pid");
    // Detached: a session of its own, and it answers.
    // SAFETY: getsid only reads a process's session id.
    assert_eq!(unsafe { libc::getsid(pid) }, pid, "its own session");
    assert!(exchange(addr, b"version\r\n", b"\r\n").starts_with("VERSION "));
    // A second daemon on the same port fails, and says so.
    let again = Command::new("timeout")
        .args(["30", env!("CARGO_BIN_EXE_kvlab"), "server", "-d"])
        .args(["-p", &port.to_string()])
        .output()
        .expect("kvlab runs");
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("Address already in use"));
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    until_gone(pid);
    assert!(!pid_file.exists(), "the pid file is removed at shutdown");
}

/// memcached's flags for parts kvlab does not have start the server, each said in one
/// line; -k and -r are applied (a refused mlockall is a warning, as in memcached).
#[test]
fn memcached_flags_without_a_counterpart_are_accepted_and_said() {
    let port = free_port().expect("free port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["server", "-t", "1", "-p", &port.to_string()])
        .args(["-L", "-k", "-r", "-e", "/tmp/kvlab-no-memory-file"])
        .args([
            "-o",
            "hashpower=20,maxconns_fast,track_sizes,slab_automove=1,temporary_ttl=10",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kvlab runs");
    let lines = stderr_lines(&mut child);
    let mut said = until_listening(&lines);
    assert!(exchange(addr, b"version\r\n", b"\r\n").starts_with("VERSION "));
    // SAFETY: kill(2) of the server this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().expect("wait");
    said.extend(lines.iter().map(|l| l + "\n"));
    for flag in [
        "-L accepted",
        "-e /tmp/kvlab-no-memory-file accepted",
        "-o hashpower=20 accepted",
        "-o maxconns_fast accepted",
        "-o track_sizes accepted",
        "-o slab_automove=1 accepted",
        "-o temporary_ttl=10 accepted",
    ] {
        assert!(said.contains(flag), "{flag:?} not said in\n{said}");
    }
}

/// `-s PATH -a MASK`: the server listens on a unix socket with those permissions (no TCP
/// port), serves it, and removes it when it stops.
#[test]
fn a_unix_socket_is_served_with_its_mask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kvlab.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["server", "-t", "1", "-a", "0760", "-s"])
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kvlab runs");
    let lines = stderr_lines(&mut child);
    until_listening(&lines);
    let connect = || std::os::unix::net::UnixStream::connect(&path);
    let mode = std::fs::metadata(&path)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o760);
    let mut s = connect().expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let got = kvlab_testkit::wire::exchange(&mut s, b"set k 0 0 2\r\nhi\r\nget k\r\n", b"END\r\n");
    assert_eq!(got, b"STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n");
    // `stats conns` names the socket as memcached does (its t/stats-conns.t): the listener's
    // addr and each connection's listen_addr are unix:PATH.
    let got = kvlab_testkit::wire::exchange(&mut s, b"stats conns\r\n", b"END\r\n");
    let stats = String::from_utf8_lossy(&got);
    let unix = format!("unix:{}", path.display());
    assert!(
        stats.lines().any(|l| l.ends_with(&format!(":addr {unix}"))),
        "{stats}"
    );
    assert!(
        stats
            .lines()
            .any(|l| l.ends_with(&format!(":listen_addr {unix}"))),
        "{stats}"
    );
    // SAFETY: kill(2) of the server this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().expect("wait");
    assert!(!path.exists(), "the socket is removed at shutdown");
}

/// `-X` and `-W` refuse the dump commands and `watch` in memcached's words (checked against
/// memcached 1.6.18 started with the same flags), and `stats settings` says so.
#[test]
fn dumps_and_watch_are_refused_as_memcached_refuses_them() {
    let port = free_port().expect("free port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let server = Spawn::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["server", "-p", &port.to_string(), "-t", "1", "-X", "-W"])
        .ready(Probe::Version(addr))
        .timeout(Duration::from_secs(20))
        .start()
        .expect("kvlab server starts with -X -W");
    let want = [
        (
            &b"stats cachedump 1 10\r\n"[..],
            "CLIENT_ERROR stats cachedump not allowed\r\n",
        ),
        (
            b"lru_crawler metadump all\r\n",
            "ERROR metadump not allowed\r\n",
        ),
        (b"watch\r\n", "CLIENT_ERROR watch commands not allowed\r\n"),
    ];
    let mut got = Vec::new();
    for (req, _) in want {
        got.push(exchange(addr, req, b"\r\n"));
    }
    let mc = kvlab_testkit::Memcached::start_with(&["-X", "-W"])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    for ((req, words), kvlab) in want.iter().zip(&got) {
        assert_eq!(kvlab, words, "kvlab, {:?}", String::from_utf8_lossy(req));
        assert_eq!(&exchange(mc.addr, req, b"\r\n"), words, "memcached");
    }
    let settings = exchange(addr, b"stats settings\r\n", b"END\r\n");
    assert!(settings.contains("STAT dump_enabled no\r\n"), "{settings}");
    server.stop();
}

/// `-p -1` listens on a port the kernel picks and, with `MEMCACHED_PORT_FILENAME` set,
/// writes it there as memcached does (`TCP INET: <port>`, its t/issue_67.t's reading).
#[test]
fn an_ephemeral_port_is_written_to_memcacheds_port_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = dir.path().join("ports");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["server", "-t", "1", "-p", "-1"])
        .env("MEMCACHED_PORT_FILENAME", &ports)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kvlab runs");
    let lines = stderr_lines(&mut child);
    let said = until_listening(&lines);
    let text = std::fs::read_to_string(&ports).expect("the port file is written");
    let port: u16 = text
        .strip_prefix("TCP INET: ")
        .and_then(|p| p.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("not memcached's format: {text:?}"));
    assert_ne!(port, 0);
    assert!(said.contains(&format!("127.0.0.1:{port} ")), "{said}");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    assert!(exchange(addr, b"version\r\n", b"\r\n").starts_with("VERSION "));
    // SAFETY: kill(2) of the server this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().expect("wait");
}
