//! The lab through its library API (not the `kvlab` binary): a tiny experiment against a
//! kvlab server writes raw results, metadata and a report; the server's worker threads are
//! what it reports; `analyse_dir` rewrites the report byte for byte. A tiny experiment through
//! `kvlab proxy` in front of a kvlab backend stores the proxy's stage times per run (total =
//! queue + worker) and the report shows where a request's time goes, the interactive law and
//! the proxy's MVA.
//!
//! The kvlab executable: `$KVLAB_BIN`, else `target/<profile>/kvlab`, built here by cargo
//! (a no-op when it is fresh).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use kvlab_lab::{analyse_dir, Lab, Overrides, Source};

use kvlab_testkit::kvlab_bin;

const TINY: &str = r#"
name = "tiny"
repetitions = 2
duration = 0.5
warmup = 0.2

[[system]]
name = "kvlab"
args = ["-t", "3", "-m", "16"]

[workload]
keys = 1000
value_size = 64

[factors]
clients = [1, 2]
"#;

fn raw_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("raw"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn tiny_experiment_through_the_library() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let source = Source {
        label: "tiny.toml".into(),
        text: TINY.into(),
        stem: "tiny".into(),
    };
    let lab = Lab::with_kvlab_bin(kvlab_bin());
    let done = lab
        .run(&source, &Overrides::default(), Some(out.clone()))
        .unwrap();
    assert_eq!(done.dir, out);
    assert!(done.summary.contains("max throughput"), "{}", done.summary);

    // 2 points × 2 repetitions × 1 system.
    let raws = raw_files(&out);
    assert_eq!(raws.len(), 4, "{raws:?}");
    for f in &raws {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        assert!(v["error"].is_null(), "{}: {}", f.display(), v["error"]);
        assert!(v["result"]["throughput_qps"].as_f64().unwrap() > 0.0);
        // Asked from the running server (`stats`), not parsed from `-t`.
        assert_eq!(v["server_threads"], 3, "{}", f.display());
    }
    assert!(out.join("meta.json").is_file());
    assert_eq!(done.report, out.join("report").join("index.html"));

    // Re-analysis from raw/ and meta.json rewrites the same report, byte for byte.
    let html = std::fs::read(&done.report).unwrap();
    let json = std::fs::read(out.join("report").join("report.json")).unwrap();
    std::fs::remove_dir_all(out.join("report")).unwrap();
    let again = analyse_dir(&out).unwrap();
    assert_eq!(again.summary, done.summary);
    assert!(
        std::fs::read(&again.report).unwrap() == html,
        "index.html differs"
    );
    assert!(
        std::fs::read(out.join("report").join("report.json")).unwrap() == json,
        "report.json differs"
    );
}

#[test]
fn a_speedup_section_follows_the_parts_and_is_reanalysed() {
    if kvlab_process::which("taskset").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::write(
        tmp.path().join("jobs.toml"),
        "[[job]]\nname = \"spin\"\ncommand = \"seq {threads}000 > /dev/null\"\ncores = [1, 2]\n",
    )
    .unwrap();
    let text = TINY
        .replace("clients = [1, 2]", "clients = [1]")
        .replace("repetitions = 2", "repetitions = 1")
        + "\n[speedup]\njobs = \"jobs.toml\"\ncpus = \"0\"\nrepetitions = 2\n";
    let label = tmp.path().join("tiny-speedup.toml");
    std::fs::write(&label, &text).unwrap();
    let source = Source {
        label: label.display().to_string(),
        text,
        stem: "tiny-speedup".into(),
    };
    let done = Lab::with_kvlab_bin(kvlab_bin())
        .run(&source, &Overrides::default(), Some(out.clone()))
        .unwrap();
    // One CPU given: the job at 1 core only, twice.
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("speedup.json")).unwrap()).unwrap();
    assert_eq!(stored["runs"].as_array().unwrap().len(), 2, "{stored}");
    assert!(done.summary.contains("spin: 1 core(s)"), "{}", done.summary);
    let html = std::fs::read_to_string(&done.report).unwrap();
    assert!(html.contains("Batch jobs: runtime vs cores"));
    std::fs::remove_dir_all(out.join("report")).unwrap();
    let again = analyse_dir(&out).unwrap();
    assert_eq!(again.summary, done.summary);
    assert_eq!(std::fs::read_to_string(&again.report).unwrap(), html);
}

const TINY_PROXY: &str = r#"
name = "tiny-proxy"
repetitions = 1
duration = 0.3
warmup = 0.2

[[system]]
name = "proxy"
kind = "proxy"
args = ["-t", "2", "--io", "epoll"]
backends = "{backends}"
backend_args = ["-t", "1", "-m", "16"]

[workload]
keys = 1000
value_size = 64
mix = "get=9,set=1"
threads = 1
interval = 0.1

[factors]
clients = [1, 2]
backends = [1]
"#;

#[test]
fn tiny_proxy_experiment_records_where_the_time_goes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let source = Source {
        label: "tiny-proxy.toml".into(),
        text: TINY_PROXY.into(),
        stem: "tiny-proxy".into(),
    };
    let lab = Lab::with_kvlab_bin(kvlab_bin());
    let done = lab
        .run(&source, &Overrides::default(), Some(out.clone()))
        .unwrap();

    // 2 points × 1 repetition; each run brackets the measured time with the proxy's stats.
    let raws = raw_files(&out);
    assert_eq!(raws.len(), 2, "{raws:?}");
    for f in &raws {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        assert!(v["error"].is_null(), "{}: {}", f.display(), v["error"]);
        assert_eq!(v["server_threads"], 2, "the proxy's workers");
        assert_eq!(v["backends"].as_array().unwrap().len(), 1, "{v}");
        let command = v["command"].as_array().unwrap();
        assert!(command.iter().any(|a| a == "--backend"), "{command:?}");
        let p = &v["proxy"];
        let n = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k} in {p}"));
        assert!(n("requests") > 0.0, "{p}");
        assert_eq!(p["backends"], 1);
        let (total, queue, worker, backend) = (
            n("total_us"),
            n("queue_us"),
            n("worker_us"),
            n("backend_us"),
        );
        assert!(
            total > 0.0 && backend > 0.0 && backend <= worker + 0.5,
            "{p}"
        );
        // total = queue + worker per request, so also in the means (up to rounding: the
        // proxy's stats give µs, or means rounded to 0.1 µs).
        assert!(
            (total - (queue + worker)).abs() <= 1.0 + 0.02 * total,
            "total {total} vs queue {queue} + worker {worker}: {p}"
        );
        // The proxy is inside what the client measured.
        let client = v["result"]["latency"]["mean_us"].as_f64().unwrap();
        assert!(total < client, "proxy {total} µs, client {client} µs");
    }
    let logs = out.join("logs");
    assert!(logs.join("proxy-1.backend0.log").is_file());
    assert!(logs.join("proxy-1.windows").join("windows.csv").is_file());

    // The report: where the time goes (a table and a chart), the interactive law and the
    // proxy's MVA.
    let json = std::fs::read_to_string(out.join("report").join("report.json")).unwrap();
    for needle in [
        "Where a request's time goes",
        "Where a request's time goes, per configuration",
        "\"kind\": \"stacked_bars\"",
        "outside the proxy",
        "interactive law R = N/X − Z",
        "Proxy MVA service demands (measured)",
        "proxy network thread",
        "backend 1 of 1",
        "Model vs measurement: proxy MVA",
    ] {
        assert!(json.contains(needle), "no {needle:?} in the report");
    }
    // The chart beside the table: a bar per point, the stages in the table's order.
    let page = std::fs::read_to_string(&done.report).unwrap();
    let chart = page
        .split("<figure class=\"plot stacked\"")
        .nth(1)
        .and_then(|f| f.split("</figure>").next())
        .expect("no stacked bars in the report");
    assert_eq!(chart.matches("class=\"stack\"").count(), 2, "{chart}");
    let legend = chart.split("class=\"legend\"").nth(1).unwrap_or_default();
    let at = |s: &str| legend.find(&format!(">{s}</text>"));
    let order: Vec<_> = [
        "net",
        "queue",
        "worker without backend",
        "backend",
        "outside the proxy",
    ]
    .iter()
    .map(|s| at(s).unwrap_or_else(|| panic!("no {s:?} in the legend: {chart}")))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    assert!(page.find("plot stacked") < page.find("<caption>Where a request"));
    let html = std::fs::read(&done.report).unwrap();
    std::fs::remove_dir_all(out.join("report")).unwrap();
    let again = analyse_dir(&out).unwrap();
    assert!(
        std::fs::read(&again.report).unwrap() == html,
        "index.html differs"
    );
}

#[test]
fn a_kvlab_system_without_an_executable_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let lab = Lab { kvlab_bin: None };
    let err = lab
        .run(
            &Source::quick(),
            &Overrides::default(),
            Some(tmp.path().into()),
        )
        .unwrap_err();
    assert!(format!("{err:#}").contains("KVLAB_BIN"), "{err:#}");
}

/// A system pinned by `cpus` and a corunner beside every run: each raw run records both, and
/// no corunner process outlives its run.
#[test]
fn pinned_system_and_corunner() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let marker = tmp.path().join("corunner-pids");
    let text = format!(
        r#"
name = "pinned"
repetitions = 1
duration = 0.5
warmup = 0.2
corunner = "echo $$ >> {marker}; exec sleep {{secs}}"

[[system]]
name = "kvlab"
args = ["-t", "2", "-m", "16"]
cpus = "{{cpus}}"

[workload]
keys = 1000
qps = 500

[factors]
cpus = ["0", "0-1"]
secs = [30]
"#,
        marker = marker.display()
    );
    let source = Source {
        label: "pinned.toml".into(),
        text,
        stem: "pinned".into(),
    };
    let lab = Lab::with_kvlab_bin(kvlab_bin());
    lab.run(&source, &Overrides::default(), Some(out.clone()))
        .unwrap();
    assert!(marker.exists(), "the corunner did not run");
    let mut seen = Vec::new();
    for f in raw_files(&out) {
        let raw: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        assert!(raw["error"].is_null(), "{raw}");
        assert_eq!(
            raw["corunner"][0],
            format!("echo $$ >> {}; exec sleep 30", marker.display())
        );
        seen.push(raw["cpus"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, ["0", "0-1"]);
    // Each corunner ("sleep 30") was killed and reaped with its run.
    let pids = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(pids.lines().count(), 2, "{pids}");
    for pid in pids.lines() {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "corunner {pid} is still there"
        );
    }
}

/// Pools of agents someone else runs (`pool = "NAME:PORT"`, as for the Kubernetes pool's
/// Service): two `kvlab bench agent`s started here, one pool each, stand for its pods. The
/// clients split over the agents, each agent's share is kept, and the lab starts nothing
/// (no host is connected).
#[test]
fn a_pool_of_running_agents_loads_the_system() {
    let ports = kvlab_process::free_ports(2).unwrap();
    let agents: Vec<std::process::Child> = ports
        .iter()
        .map(|p| {
            std::process::Command::new(kvlab_bin())
                .args(["bench", "agent", "--listen", &format!("127.0.0.1:{p}")])
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for p in &ports {
        kvlab_process::wait_ready(
            &kvlab_process::Probe::Connects(([127, 0, 0, 1], *p).into()),
            std::time::Duration::from_secs(20),
        )
        .unwrap();
    }
    let text = format!(
        "name = \"pool\"\nrepetitions = 1\nduration = 0.5\nwarmup = 0.2\nagents = [\"k1\", \"k2\"]\n\
         [[system]]\nname = \"kvlab\"\nargs = [\"-t\", \"1\", \"-m\", \"16\"]\n\
         [workload]\nkeys = 1000\nvalue_size = 32\nclients = 4\n\
         [[host]]\nname = \"k1\"\npool = \"127.0.0.1:{}\"\n[[host]]\nname = \"k2\"\npool = \"127.0.0.1:{}\"\n",
        ports[0], ports[1]
    );
    let out = tempfile::tempdir().unwrap();
    let done = Lab::with_kvlab_bin(kvlab_bin()).run(
        &Source {
            label: "pool.toml".into(),
            text,
            stem: "pool".into(),
        },
        &Overrides::default(),
        Some(out.path().join("r")),
    );
    for mut a in agents {
        let _ = a.kill();
        let _ = a.wait();
    }
    let done = done.unwrap();
    let (_, raws) = kvlab_lab::runner::load(&done.dir).unwrap();
    assert_eq!(raws.len(), 1);
    let raw = &raws[0];
    assert!(raw.error.is_none(), "{:?}", raw.error);
    let hosts: Vec<(&str, usize)> = raw
        .agents
        .iter()
        .map(|a| (a.host.as_str(), a.population))
        .collect();
    assert_eq!(hosts, [("k1", 2), ("k2", 2)], "{:?}", raw.agents);
    assert!(
        raw.agents.iter().all(|a| a.completed > 0),
        "{:?}",
        raw.agents
    );
    assert!(raw.placed.is_empty(), "nothing placed: {:?}", raw.placed);
}
