//! Every command's keys reach the ownership gate: a walk over every variant of
//! [`Request`], each sent once with keys this node owns (served here) and once with its last
//! key owned by another node (redirected with `MOVED`).
//!
//! The walk is a table the compiler checks: `variant` matches every request with no
//! catch-all arm, so a new command fails to compile here until it has a name in `variants!`,
//! which puts it in `V::ALL`; `sample` then fails to compile until it has a sample.

use std::sync::Arc;

use kvlab_protocol::{parse, Admin, Limits, MetaCommand, Parsed, Request, StoreCommand};
use kvlab_server::engine::Engine;
use kvlab_server::stats::{ServerStats, WorkerStats};
use kvlab_store::{Store, StoreConfig, SystemClock};

use super::{NodeConn, NodeEngine};
use crate::node::Node;
use crate::topology::{FileStore, Topology, TopologyStore};

macro_rules! variants {
    ($($v:ident),* $(,)?) => {
        /// Every command, as the walk tells them apart.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum V { $($v),* }
        impl V {
            const ALL: &'static [V] = &[$(V::$v),*];
        }
    };
}

variants!(
    Get,
    Gat,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Arith,
    Delete,
    Touch,
    FlushAll,
    Verbosity,
    SlabsAutomove,
    Cluster,
    Version,
    Quit,
    Stats,
    Admin,
    MetaGet,
    MetaSet,
    MetaDelete,
    MetaArith,
    MetaNoop,
    MetaDebug,
);

/// Which command `req` is (no catch-all arm: a new variant fails to compile here).
fn variant(req: &Request<'_>) -> V {
    match req {
        Request::Get { .. } => V::Get,
        Request::Gat { .. } => V::Gat,
        Request::Store { command, .. } => match command {
            StoreCommand::Set => V::Set,
            StoreCommand::Add => V::Add,
            StoreCommand::Replace => V::Replace,
            StoreCommand::Append => V::Append,
            StoreCommand::Prepend => V::Prepend,
            StoreCommand::Cas => V::Cas,
        },
        Request::Arith { .. } => V::Arith,
        Request::Delete { .. } => V::Delete,
        Request::Touch { .. } => V::Touch,
        Request::FlushAll { .. } => V::FlushAll,
        Request::Verbosity { .. } => V::Verbosity,
        Request::SlabsAutomove { .. } => V::SlabsAutomove,
        Request::Cluster { .. } => V::Cluster,
        Request::Version => V::Version,
        Request::Quit => V::Quit,
        Request::Stats { .. } => V::Stats,
        Request::Admin(admin) => match admin {
            Admin::Shutdown(_)
            | Admin::CacheMemlimit { .. }
            | Admin::SlabsReassign { .. }
            | Admin::StatsDetail(_)
            | Admin::StatsCachedump(_)
            | Admin::LruCrawler(_)
            | Admin::Watch { .. } => V::Admin,
        },
        Request::Meta { command, .. } => match command {
            MetaCommand::Get => V::MetaGet,
            MetaCommand::Set => V::MetaSet,
            MetaCommand::Delete => V::MetaDelete,
            MetaCommand::Arith => V::MetaArith,
            MetaCommand::Noop => V::MetaNoop,
            MetaCommand::Debug => V::MetaDebug,
        },
    }
}

/// A sample of each command, its keys written `{}` (a retrieval names several).
fn sample(v: V) -> &'static str {
    match v {
        V::Get => "get {} {} {}\r\n",
        V::Gat => "gats 100 {} {}\r\n",
        V::Set => "set {} 0 0 1\r\nx\r\n",
        V::Add => "add {} 0 0 1\r\nx\r\n",
        V::Replace => "replace {} 0 0 1\r\nx\r\n",
        V::Append => "append {} 0 0 1\r\nx\r\n",
        V::Prepend => "prepend {} 0 0 1\r\nx\r\n",
        V::Cas => "cas {} 0 0 1 5\r\nx\r\n",
        V::Arith => "incr {} 1\r\n",
        V::Delete => "delete {}\r\n",
        V::Touch => "touch {} 100\r\n",
        V::FlushAll => "flush_all\r\n",
        V::Verbosity => "verbosity 1\r\n",
        V::SlabsAutomove => "slabs automove 1\r\n",
        V::Cluster => "cluster ring\r\n",
        V::Version => "version\r\n",
        V::Quit => "quit\r\n",
        V::Stats => "stats\r\n",
        V::Admin => "stats detail dump\r\n",
        V::MetaGet => "mg {} v\r\n",
        V::MetaSet => "ms {} 1 MA\r\nx\r\n",
        V::MetaDelete => "md {}\r\n",
        V::MetaArith => "ma {}\r\n",
        V::MetaNoop => "mn\r\n",
        V::MetaDebug => "me {}\r\n",
    }
}

/// A node that owns about half the keys (the other half is another node's), its store, and
/// the keys `k<i>` it owns and does not.
fn node() -> (
    tempfile::TempDir,
    Arc<Node>,
    Arc<Store>,
    Vec<String>,
    Vec<String>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topology.json");
    let (me, other) = ("127.0.0.1:2".to_string(), "127.0.0.1:1".to_string());
    let t = Topology::new(16, vec![me.clone(), other]);
    assert!(FileStore::new(&path).swap(None, &t).unwrap());
    let store = Arc::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
    let node = Node::start(me.clone(), store.clone(), Box::new(FileStore::new(&path))).unwrap();
    let ring = t.serving();
    let (mine, theirs): (Vec<String>, Vec<String>) = (0..64)
        .map(|i| format!("k{i}"))
        .partition(|k| ring.owner(k.as_bytes()) == Some(me.as_str()));
    assert!(mine.len() >= 3 && !theirs.is_empty());
    (dir, node, store, mine, theirs)
}

/// Sends `line` through a fresh connection to the node's service; returns the reply.
fn call(engine: &mut NodeEngine, line: &str) -> String {
    let Parsed::Request { request, .. } = parse(line.as_bytes(), &Limits::default()) else {
        panic!("{line:?} does not parse")
    };
    let mut conn = NodeConn::default();
    let mut out = Vec::new();
    kvlab_net::Service::call(engine, &mut conn, &request, &mut out, false);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn every_keyed_commands_keys_reach_the_gate() {
    let (_dir, node, store, mine, theirs) = node();
    let worker = Arc::new(WorkerStats::default());
    let server = Arc::new(ServerStats::for_tests(vec![worker.clone()]));
    let mut engine = NodeEngine::new(Engine::new(store, server, worker), &node);
    for &v in V::ALL {
        let template = sample(v);
        let slots = template.matches("{}").count();
        // All keys this node's, then the last one another node's.
        let keys_with = |last: &str| -> Vec<String> {
            let mut keys: Vec<String> =
                mine.iter().take(slots.saturating_sub(1)).cloned().collect();
            if slots > 0 {
                keys.push(last.to_string());
            }
            keys
        };
        let fill = |keys: &[String]| {
            keys.iter().fold(template.to_string(), |line, key| {
                line.replacen("{}", key, 1)
            })
        };
        let expected = keys_with(&theirs[0]);
        let served = fill(&keys_with(&mine[slots.saturating_sub(1)]));
        let moved = fill(&expected);
        let Parsed::Request { request, .. } = parse(moved.as_bytes(), &Limits::default()) else {
            panic!("{moved:?} does not parse")
        };
        assert_eq!(variant(&request), v, "{moved:?} is not a sample of {v:?}");
        let reply = call(&mut engine, &served);
        assert!(!reply.contains("MOVED"), "{served:?}: {reply:?}");
        if slots > 0 {
            let reply = call(&mut engine, &moved);
            assert!(
                reply.starts_with("SERVER_ERROR MOVED ") && reply.ends_with(" 127.0.0.1:1\r\n"),
                "{moved:?} was not sent to its owner: {reply:?}"
            );
        }
        let mut keys = Vec::new();
        request
            .keys()
            .for_each(|k| keys.push(String::from_utf8_lossy(k).into_owned()));
        assert_eq!(keys, expected, "{moved:?}: the keys it names");
    }
    node.stop();
}
