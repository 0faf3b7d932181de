//! The cache engine under the sans-IO session.

use std::sync::atomic::Ordering::Relaxed;

use kvlab_net::Work;
use kvlab_protocol::Limits;
use kvlab_store::{ManualClock, SetMode, SetRequest, SetStatus, StoreConfig};

use super::*;
use crate::cache::MAX_LOADS;
use crate::stats::VERSION;
use crate::Session;

fn engine() -> Engine {
    let store = Arc::new(Store::new(
        StoreConfig::default(),
        Arc::new(ManualClock::new(1_800_000_000)),
    ));
    engine_over(store)
}

fn engine_over(store: Arc<Store>) -> Engine {
    let worker = Arc::new(WorkerStats::default());
    let server = Arc::new(ServerStats::for_tests(vec![worker.clone()]));
    Engine::new(store, server, worker)
}

fn feed(s: &mut Session, e: &mut Engine, bytes: &[u8], chunk: usize) {
    let mut at = 0;
    while at < bytes.len() && s.wants_read() {
        let space = s.read_space();
        let n = space.len().min(chunk).min(bytes.len() - at);
        space[..n].copy_from_slice(&bytes[at..at + n]);
        s.filled(n);
        at += n;
        s.process_inline(e);
    }
}

#[test]
fn pipelined_replies_keep_request_order() {
    let (mut s, mut e) = (Session::new(Limits::default()), engine());
    let req = b"set a 0 0 1\r\n1\r\nget a\r\ndelete a\r\nget a\r\nbogus\r\nversion\r\n";
    // Byte by byte: every split point of a pipeline gives the same replies.
    feed(&mut s, &mut e, req, 1);
    let out = s.output().to_vec();
    s.wrote(out.len());
    let want = format!(
        "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nDELETED\r\nEND\r\nERROR\r\nVERSION {VERSION}\r\n"
    );
    assert_eq!(String::from_utf8_lossy(&out), want);
}

fn sync_store(dir: &std::path::Path) -> Arc<Store> {
    let mut durable = kvlab_store::DurableConfig::new(dir);
    durable.durability = kvlab_store::Durability::Sync;
    let clock = Arc::new(ManualClock::new(1_800_000_000));
    Arc::new(Store::open(StoreConfig::default(), clock, durable).expect("store opens"))
}

fn take(s: &mut Session) -> String {
    let out = s.output().to_vec();
    s.wrote(out.len());
    String::from_utf8_lossy(&out).into_owned()
}

/// On a loop with helper threads, the durable cache's disk work is a barrier: a persist
/// holds its reply back, a read-through re-runs its request, and nothing after either
/// runs until it completes.
#[test]
fn disk_work_is_a_barrier_on_a_loop_with_helpers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut e = engine_over(sync_store(dir.path()));
    let mut s = Session::new(Limits::default());
    let req = b"set k 0 0 1\r\nv\r\nversion\r\n";
    s.read_space()[..req.len()].copy_from_slice(req);
    s.filled(req.len());
    s.process(&mut e);
    assert_eq!(take(&mut s), "", "STORED waits for the persist");
    let (id, work) = s.take_work().expect("a persist");
    assert_eq!(work, Blocking::Persist(b"k".to_vec()));
    assert!(s.take_work().is_none(), "version waits behind the barrier");
    s.complete(id, work.run(&mut e.helper.clone()));
    s.process(&mut e);
    assert_eq!(take(&mut s), format!("STORED\r\nVERSION {VERSION}\r\n"));

    // Reopened, the key is on disk only: a get reads it through, then runs again.
    drop((s, e));
    let mut e = engine_over(sync_store(dir.path()));
    let mut s = Session::new(Limits::default());
    let req = b"get k\r\nget k\r\n";
    s.read_space()[..req.len()].copy_from_slice(req);
    s.filled(req.len());
    s.process(&mut e);
    assert_eq!(take(&mut s), "");
    let (id, work) = s.take_work().expect("a read-through");
    assert_eq!(work, Blocking::Load(ReadThrough::new(b"k")));
    assert!(s.take_work().is_none());
    s.complete(id, work.run(&mut e.helper.clone()));
    s.process(&mut e);
    assert_eq!(take(&mut s), "VALUE k 0 1\r\nv\r\nEND\r\n".repeat(2));
}

/// A durable store whose cache holds 64 items (one shard), over `dir`.
fn small_cache(dir: &std::path::Path) -> Arc<Store> {
    let config = StoreConfig {
        max_items: 64,
        ..StoreConfig::default()
    };
    let clock = Arc::new(ManualClock::new(1_800_000_000));
    let mut durable = kvlab_store::DurableConfig::new(dir);
    // What is queued stays queued: the test commits with `sync_all`.
    durable.flush_interval = std::time::Duration::from_secs(3600);
    Arc::new(Store::open(config, clock, durable).expect("store opens"))
}

/// Stores keys `other:FROM..TO` straight into the store, as other connections would:
/// in a 64-item cache they evict whatever was there.
fn fill(store: &Store, from: usize, to: usize) {
    for i in from..to {
        let key = format!("other:{i}");
        let req = SetRequest::new(SetMode::Set, key.as_bytes(), b"x");
        assert!(matches!(store.set(&req), SetStatus::Stored { .. }));
    }
}

/// Runs `req` on `e`: each read-through it defers runs, then `between` (other
/// connections' stores before the request re-runs). Returns the reply and the number
/// of read-throughs.
fn run_through(e: &mut Engine, req: &[u8], between: &dyn Fn(&Store)) -> (String, usize) {
    let mut s = Session::new(Limits::default());
    s.read_space()[..req.len()].copy_from_slice(req);
    s.filled(req.len());
    s.process(e);
    let mut loads = 0;
    while let Some((id, work)) = s.take_work() {
        assert!(matches!(work, Blocking::Load(_)), "{work:?}");
        loads += 1;
        let done = work.run(&mut e.helper.clone());
        between(&e.store);
        s.complete(id, done);
        s.process(e);
    }
    (take(&mut s), loads)
}

/// Under a small cache, the item a read-through brought in can be evicted again by other
/// stores before its request re-runs: a `get` still answers with it (what the disk held
/// during the request), never a miss; a command that needs the item in memory (`append`)
/// reads it through again.
#[test]
fn an_item_evicted_again_before_the_rerun_is_still_served() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = small_cache(dir.path());
    let mut e = engine_over(store.clone());
    let req = SetRequest::new(SetMode::Set, b"k", b"v");
    assert!(matches!(store.set(&req), SetStatus::Stored { .. }));
    fill(&store, 0, 200);
    store.sync_all().expect("sync");
    assert!(store.peek(b"k").is_none(), "k is on disk only");

    let evict = |store: &Store| {
        fill(store, 1000, 1200);
        assert!(store.peek(b"k").is_none(), "k left memory again");
    };
    let hits = store.stats().get_hits;
    let (reply, loads) = run_through(&mut e, b"get k\r\n", &evict);
    assert_eq!((reply.as_str(), loads), ("VALUE k 0 1\r\nv\r\nEND\r\n", 1));
    assert_eq!(store.stats().get_hits, hits + 1);
    let (reply, _) = run_through(&mut e, b"gets k nothing\r\n", &evict);
    assert!(reply.starts_with("VALUE k 0 1 "), "{reply}");
    assert!(reply.ends_with("\r\nv\r\nEND\r\n"), "{reply}");

    // Evicted once, then left in memory: the append reads k through a second time.
    let once = std::sync::atomic::AtomicBool::new(true);
    let evict_once = |store: &Store| {
        if once.swap(false, Relaxed) {
            evict(store);
        }
    };
    let (reply, loads) = run_through(&mut e, b"append k 0 0 1\r\nw\r\n", &evict_once);
    assert_eq!((reply.as_str(), loads), ("STORED\r\n", 2));
    evict(&store);
    let (reply, _) = run_through(&mut e, b"get k\r\n", &evict);
    assert_eq!(reply, "VALUE k 0 2\r\nvw\r\nEND\r\n");

    // Written and evicted again between the read-through and the re-run: the newer
    // version, queued for the disk, is served; deleted, the key reads as deleted.
    evict(&store);
    let (reply, _) = run_through(&mut e, b"get k\r\n", &|store: &Store| {
        let req = SetRequest::new(SetMode::Set, b"k", b"new");
        assert!(matches!(store.set(&req), SetStatus::Stored { .. }));
        evict(store);
    });
    assert_eq!(reply, "VALUE k 0 3\r\nnew\r\nEND\r\n");
    evict(&store);
    let (reply, _) = run_through(&mut e, b"get k\r\n", &|store: &Store| {
        assert!(store.delete(b"k"));
        evict(store);
    });
    assert_eq!(reply, "END\r\n");
}

/// A command that needs its item in memory, whose item other stores evict after every
/// read-through, fails with memcached's out-of-memory error after the last allowed one
/// rather than run on a key it cannot see: an `add` must not overwrite the stored value,
/// an `incr` or a `delete` must not answer `NOT_FOUND` for a key that exists.
#[test]
fn a_command_whose_item_never_stays_in_memory_fails_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = small_cache(dir.path());
    let mut e = engine_over(store.clone());
    let req = SetRequest::new(SetMode::Set, b"k", b"7");
    assert!(matches!(store.set(&req), SetStatus::Stored { .. }));
    fill(&store, 0, 200);
    store.sync_all().expect("sync");
    let evict = |store: &Store| {
        fill(store, 1000, 1200);
        assert!(store.peek(b"k").is_none(), "k left memory again");
    };
    let cases: [(&[u8], &str); 6] = [
        (
            b"add k 0 0 1\r\nz\r\n",
            "SERVER_ERROR out of memory storing object\r\n",
        ),
        (
            b"append k 0 0 1\r\nz\r\n",
            "SERVER_ERROR out of memory storing object\r\n",
        ),
        (b"incr k 1\r\n", "SERVER_ERROR out of memory\r\n"),
        (b"delete k\r\n", "SERVER_ERROR out of memory\r\n"),
        (b"touch k 100\r\n", "SERVER_ERROR out of memory\r\n"),
        (b"add k 0 0 1 noreply\r\nz\r\n", ""),
    ];
    for (req, want) in cases {
        let (reply, loads) = run_through(&mut e, req, &evict);
        let cmd = String::from_utf8_lossy(req);
        assert_eq!((reply.as_str(), loads), (want, MAX_LOADS), "{cmd}");
        // The stored value is untouched.
        let (reply, _) = run_through(&mut e, b"get k\r\n", &|_: &Store| {});
        assert_eq!(reply, "VALUE k 0 1\r\n7\r\nEND\r\n", "after {cmd}");
        evict(&store);
    }
    // Given room, the same commands run.
    let (reply, _) = run_through(&mut e, b"incr k 1\r\n", &|_: &Store| {});
    assert_eq!(reply, "8\r\n");
}

#[test]
fn protocol_errors_and_too_large_values_are_counted() {
    let (mut s, mut e) = (Session::new(Limits::default()), engine());
    let mut req = b"bogus\r\nset k 0 0 5000000\r\n".to_vec();
    req.extend(std::iter::repeat_n(b'x', 5_000_000));
    req.extend_from_slice(b"\r\n");
    feed(&mut s, &mut e, &req, 64 * 1024);
    assert_eq!(e.worker.protocol_errors.load(Relaxed), 2);
    assert_eq!(e.store.stats().store_too_large, 1);
}
