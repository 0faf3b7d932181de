//! The nemesis: carries out a [`Schedule`] against a [`System`] while the clients run, on
//! two lanes, each taking its faults in order at their due times (late when the fault
//! before it ran long), recording every action in the history's timeline.
//!
//! ```text
//!  membership lane: add │ remove │ add-two │ remove-two │ coordinator-kill
//!     one migration at a time (holds System::migrations while it drives one)
//!  fault lane:      kill -9 + restart (+ rejoin, + its catch-up) │ pause │ flush │ etcd-kill
//!                   │ partition + heal (+ rejoin) │ delay + clear      (namespaces)
//!     one node faulted at a time; a node a fault acts on is claimed (busy), so the
//!     membership lane does not remove it meanwhile, and the other way round
//! ```
//!
//! A partition cuts a node off from everything (clients included), or from one peer: another
//! node of the ring, an etcd member or the proxy (`pick % peers`), with iptables DROP in
//! the node's namespace; a delay slows every packet it sends. Each is healed after its
//! drawn duration, and the record spans the fault from its start to its heal.
//!
//! A fault's target is chosen when it comes due, among the nodes that fit then
//! (`pick % candidates`). A fault with no fitting target (nothing to remove without going
//! below the smallest ring, too many nodes to add one more) is recorded as skipped. Every
//! fault is bounded in time: pauses and deaths last what the schedule drew, coordinators at
//! most [`crate::system::COORDINATOR_TIMEOUT`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvlab_cluster::Phase;
use parking_lot::Mutex;

use crate::history::{Clock, NemesisEvent};
use crate::schedule::{Event, Fault, Schedule};
use crate::system::{NodeState, System};

/// The nemesis of one run.
pub struct Nemesis {
    sys: Arc<System>,
    clock: Clock,
    end: Instant,
    /// Set when the run is interrupted: no further fault starts.
    interrupt: Arc<AtomicBool>,
    log: Mutex<Vec<NemesisEvent>>,
    /// The ring never shrinks below this many nodes.
    min_ring: usize,
    /// Nodes started and not stopped never exceed this.
    max_live: usize,
}

/// The longest the fault lane waits for a restarted node to catch up from its peers.
pub const CATCH_UP: Duration = Duration::from_secs(20);

/// How the detail of a fault skipped for want of a fitting target begins.
pub const SKIPPED: &str = "skipped: ";

/// What a coordinator's failure says when another migration came first.
fn lost_race(text: &str) -> bool {
    text.contains("under way") || text.contains("changed meanwhile")
}

impl Nemesis {
    /// A nemesis acting on `sys` until `end` or `interrupt` (no fault starts later).
    pub fn new(
        sys: Arc<System>,
        clock: Clock,
        end: Instant,
        interrupt: Arc<AtomicBool>,
        min_ring: usize,
        max_live: usize,
    ) -> Nemesis {
        Nemesis {
            sys,
            clock,
            end,
            interrupt,
            log: Mutex::new(Vec::new()),
            min_ring,
            max_live,
        }
    }

    /// Starts both lanes on `schedule`'s faults.
    pub fn start(self: &Arc<Self>, schedule: &Schedule) -> Vec<JoinHandle<()>> {
        let (membership, faults): (Vec<Event>, Vec<Event>) = schedule
            .events
            .iter()
            .cloned()
            .partition(|e| e.fault.kind().membership());
        [("membership", membership), ("faults", faults)]
            .into_iter()
            .filter_map(|(name, events)| {
                let me = Arc::clone(self);
                std::thread::Builder::new()
                    .name(format!("kvlab-nemesis-{name}"))
                    .spawn(move || me.lane(events))
                    .ok()
            })
            .collect()
    }

    /// Everything recorded so far.
    pub fn events(&self) -> Vec<NemesisEvent> {
        self.log.lock().clone()
    }

    /// Records an action that began at `start_ns` and ends now.
    pub fn record(&self, start_ns: u64, what: &str, target: &str, ok: bool, detail: String) {
        self.log.lock().push(NemesisEvent {
            start_ns,
            end_ns: self.clock.now_ns(),
            what: what.to_string(),
            target: target.to_string(),
            ok,
            detail: (!detail.is_empty()).then_some(detail),
        });
    }

    fn skip(&self, what: &str, why: &str) {
        self.record(
            self.clock.now_ns(),
            what,
            "",
            false,
            format!("{SKIPPED}{why}"),
        );
    }

    fn lane(&self, events: Vec<Event>) {
        for e in events {
            let due = self.clock.at(e.at_ms.saturating_mul(1_000_000));
            if due >= self.end {
                break;
            }
            // Waiting for the fault's due time (the schedule, not a synchronisation), in
            // steps, so that an interrupted run ends soon.
            while Instant::now() < due && !self.interrupted() {
                std::thread::sleep(
                    due.saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(100)),
                );
            }
            if Instant::now() >= self.end || self.interrupted() {
                break;
            }
            self.run(&e.fault);
        }
    }

    fn interrupted(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }

    /// The ring's nodes (and those joining it), or every node started when the topology
    /// cannot be read (etcd down).
    fn candidates(&self) -> Vec<String> {
        match self.sys.topology() {
            Ok(t) => System::ring_nodes(&t),
            Err(_) => self.sys.seeds().iter().map(ToString::to_string).collect(),
        }
    }

    fn run(&self, fault: &Fault) {
        let what = fault.kind().name();
        match *fault {
            Fault::Pause { pick, pause_ms } => {
                let Some(node) = self.sys.claim(pick, &self.candidates(), &[NodeState::Up]) else {
                    return self.skip(what, "no running node");
                };
                let start = self.clock.now_ns();
                match self.sys.pause(&node) {
                    Err(e) => self.record(start, what, &node, false, e),
                    Ok(()) => {
                        std::thread::sleep(Duration::from_millis(pause_ms.into()));
                        let r = self.sys.resume(&node);
                        let detail = match &r {
                            Ok(()) => format!("SIGSTOP, SIGCONT after {pause_ms} ms"),
                            Err(e) => format!("SIGCONT: {e}"),
                        };
                        self.record(start, what, &node, r.is_ok(), detail);
                    }
                }
                self.sys.release(&node);
            }
            Fault::Kill { pick, down_ms } => {
                let Some(node) = self.sys.claim(pick, &self.candidates(), &[NodeState::Up]) else {
                    return self.skip(what, "no running node");
                };
                let start = self.clock.now_ns();
                let r = self.sys.kill(&node).and_then(|()| {
                    std::thread::sleep(Duration::from_millis(down_ms.into()));
                    self.sys.restart(&node)
                });
                let detail = match &r {
                    Ok(()) => format!("kill -9, restarted after {down_ms} ms"),
                    Err(e) => e.clone(),
                };
                self.record(start, what, &node, r.is_ok(), detail);
                if r.is_ok() {
                    self.rejoin(&node);
                    self.caught_up(&node);
                }
                self.sys.release(&node);
            }
            Fault::Flush { pick } => {
                let Some(node) = self.sys.claim(pick, &self.candidates(), &[NodeState::Up]) else {
                    return self.skip(what, "no running node");
                };
                let start = self.clock.now_ns();
                let r = self.sys.flush(&node);
                self.record(
                    start,
                    what,
                    &node,
                    r.is_ok(),
                    r.err().unwrap_or_else(|| "flush_all".into()),
                );
                self.sys.release(&node);
            }
            Fault::EtcdKill { pick, down_ms } => {
                if self.sys.etcd_members() == 0 {
                    return self.skip(what, "the topology is not in etcd");
                }
                let start = self.clock.now_ns();
                match self.sys.etcd_kill(pick as usize) {
                    Err(e) => self.record(start, what, "", false, e),
                    Ok(member) => {
                        std::thread::sleep(Duration::from_millis(down_ms.into()));
                        let r = self.sys.etcd_restart();
                        let detail = match &r {
                            Ok(()) => format!("kill -9, restarted after {down_ms} ms"),
                            Err(e) => e.clone(),
                        };
                        self.record(start, what, &member, r.is_ok(), detail);
                    }
                }
            }
            Fault::Partition {
                pick,
                peer,
                heal_ms,
            } => self.partition(pick, peer, heal_ms),
            Fault::Delay {
                pick,
                delay_ms,
                heal_ms,
            } => self.delay(pick, delay_ms, heal_ms),
            Fault::Add => self.add(what, 1),
            Fault::AddTwo => self.add(what, 2),
            Fault::Remove { pick } => self.remove(what, pick, 1),
            Fault::RemoveTwo { pick } => self.remove(what, pick, 2),
            Fault::CoordinatorKill {
                add,
                pick,
                after_ms,
                abort,
            } => self.coordinator_kill(add, pick, after_ms, abort),
        }
    }

    /// Cuts a node off from everything, or from the peer `peer` chooses, for `heal_ms`.
    fn partition(&self, pick: u32, peer: Option<u32>, heal_ms: u32) {
        let what = "partition";
        let Some(net) = self.sys.net() else {
            return self.skip(what, "the nodes are not in network namespaces");
        };
        let candidates = self.candidates();
        let Some(node) = self.sys.claim(pick, &candidates, &[NodeState::Up]) else {
            return self.skip(what, "no running node");
        };
        let Some(h) = self.sys.host_of(&node) else {
            self.sys.release(&node);
            return self.skip(what, "the node has no namespace");
        };
        // Its peers: the other nodes of the ring, etcd's members, the proxy.
        let mut peers: Vec<(String, u32)> = candidates
            .iter()
            .filter(|n| **n != node)
            .filter_map(|n| Some((format!("node {n}"), self.sys.host_of(n)?)))
            .collect();
        peers.extend(self.sys.etcd_hosts());
        peers.extend(self.sys.proxy_host().map(|h| ("the proxy".to_string(), h)));
        let cut = match peer {
            Some(p) if !peers.is_empty() => Some(peers[p as usize % peers.len()].clone()),
            _ => None,
        };
        let from = cut
            .as_ref()
            .map_or("everything (clients too)".to_string(), |(n, _)| n.clone());
        let start = self.clock.now_ns();
        match net.partition(h, cut.as_ref().map(|(_, h)| *h)) {
            Err(e) => self.record(start, what, &node, false, e),
            Ok(_) => {
                std::thread::sleep(Duration::from_millis(heal_ms.into()));
                let healed = net.heal(h);
                let detail = match &healed {
                    Ok(_) => {
                        format!("cut off from {from} (iptables DROP), healed after {heal_ms} ms")
                    }
                    Err(e) => format!("cut off from {from}; healing: {e}"),
                };
                self.record(start, what, &node, healed.is_ok(), detail);
            }
        }
        self.sys.release(&node);
        self.rejoin(&node);
    }

    /// Delays every packet a node sends by `delay_ms`, for `heal_ms`.
    fn delay(&self, pick: u32, delay_ms: u32, heal_ms: u32) {
        let what = "delay";
        let Some(net) = self.sys.net() else {
            return self.skip(what, "the nodes are not in network namespaces");
        };
        let Some(node) = self.sys.claim(pick, &self.candidates(), &[NodeState::Up]) else {
            return self.skip(what, "no running node");
        };
        let Some(h) = self.sys.host_of(&node) else {
            self.sys.release(&node);
            return self.skip(what, "the node has no namespace");
        };
        let how = if net.netem() {
            "tc netem"
        } else {
            "NFQUEUE delayer: this kernel has no netem"
        };
        let start = self.clock.now_ns();
        match net.delay(h, delay_ms) {
            Err(e) => self.record(start, what, &node, false, e),
            Ok(_) => {
                std::thread::sleep(Duration::from_millis(heal_ms.into()));
                let cleared = net.clear(h);
                let detail = match &cleared {
                    Ok(_) => format!(
                        "+{delay_ms} ms on every packet it sends ({how}), cleared after \
                         {heal_ms} ms"
                    ),
                    Err(e) => format!("+{delay_ms} ms ({how}); clearing: {e}"),
                };
                self.record(start, what, &node, cleared.is_ok(), detail);
            }
        }
        self.sys.release(&node);
    }

    /// With the topology in etcd, a killed or cut-off node's lease lapses and a live node
    /// takes it out of the ring; once restarted or healed it is added back.
    /// Waits (at most [`CATCH_UP`]) until a node restarted without its data has caught up
    /// from its peers. Until then it is not whole: with two copies, a second node dying
    /// meanwhile takes the last copy of the keys the two share — two failures at once, more
    /// than two copies survive — so the fault lane's next fault waits for it.
    fn caught_up(&self, node: &str) {
        let start = self.clock.now_ns();
        let deadline = Instant::now() + CATCH_UP;
        loop {
            let status = kvlab_cluster::coordinator::node_status(node);
            let recovering = status
                .as_ref()
                .map(|s| s["recovering"].as_bool().unwrap_or(false));
            match recovering {
                Ok(false) => {
                    let waited = (self.clock.now_ns() - start) / 1_000_000;
                    if waited > 0 {
                        self.record(start, "caught-up", node, true, format!("after {waited} ms"));
                    }
                    return;
                }
                _ if Instant::now() >= deadline || self.interrupted() => {
                    let why = match status {
                        Ok(_) => "still catching up".to_string(),
                        Err(e) => e.to_string(),
                    };
                    self.record(start, "caught-up", node, false, why);
                    return;
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn rejoin(&self, node: &str) {
        if self.sys.etcd_members() == 0 {
            return;
        }
        let _one = self.sys.migrations.lock();
        let start = self.clock.now_ns();
        match self.sys.topology() {
            Ok(t) if System::ring_nodes(&t).iter().any(|n| n == node) => {}
            Ok(_) => {
                let (ok, said) = self.sys.coordinator(&["add", node]);
                self.record(start, "rejoin", node, ok, said);
            }
            Err(e) => self.record(start, "rejoin", node, false, e),
        }
    }

    /// Runs one coordinator per job at once; a job that lost the race to another (its
    /// migration came second) is tried again once the others ended.
    fn coordinate(&self, what: &str, jobs: &[(&str, String)]) {
        let start = self.clock.now_ns();
        let started: Vec<_> = jobs
            .iter()
            .map(|(verb, node)| (*verb, node, self.sys.coordinator_start(&[verb, node])))
            .collect();
        let mut again = Vec::new();
        for (verb, node, id) in started {
            let (ok, said) = match id {
                Ok(id) => self.sys.coordinator_wait(id, &[verb, node]),
                Err(e) => (false, e),
            };
            if !ok && jobs.len() > 1 && lost_race(&said) {
                again.push((verb, node, said));
            } else {
                self.record(start, what, node, ok, said);
            }
        }
        for (verb, node, first) in again {
            let retry = self.clock.now_ns();
            // The topology's compare-and-swap refused the second migration: as it should.
            self.record(start, what, node, true, format!("lost the race: {first}"));
            let (ok, said) = self.sys.coordinator(&[verb, node]);
            self.record(retry, what, node, ok, format!("tried again: {said}"));
        }
    }

    /// Stops nodes a membership change left outside the ring; frees the others.
    fn settle_nodes(&self, nodes: &[String]) {
        let ring = self.sys.topology().map(|t| System::ring_nodes(&t));
        for n in nodes {
            match &ring {
                Ok(r) if !r.contains(n) => self.sys.stop(n),
                _ => self.sys.release(n),
            }
        }
    }

    fn add(&self, what: &str, n: usize) {
        let _one = self.sys.migrations.lock();
        if self.sys.live_nodes() + n > self.max_live {
            return self.skip(
                what,
                &format!("{} nodes run already", self.sys.live_nodes()),
            );
        }
        let mut nodes = Vec::new();
        for _ in 0..n {
            let start = self.clock.now_ns();
            match self.sys.start_node() {
                Ok(name) => nodes.push(name),
                Err(e) => self.record(start, what, "", false, e),
            }
        }
        let jobs: Vec<(&str, String)> = nodes.iter().map(|n| ("add", n.clone())).collect();
        self.coordinate(what, &jobs);
        self.settle_nodes(&nodes);
    }

    /// Claims `n` nodes that may leave the ring (it keeps `min_ring`), starting at `pick`.
    fn removable(&self, what: &str, pick: u32, n: usize) -> Option<Vec<String>> {
        let t = match self.sys.topology() {
            Ok(t) => t,
            Err(e) => {
                self.skip(what, &e);
                return None;
            }
        };
        if let Some(m) = &t.migration {
            self.skip(what, &format!("migration {} is under way", m.id));
            return None;
        }
        if t.nodes.len() < self.min_ring + n {
            self.skip(
                what,
                &format!(
                    "{} nodes in the ring, at least {} stay",
                    t.nodes.len(),
                    self.min_ring
                ),
            );
            return None;
        }
        let mut nodes = Vec::new();
        for i in 0..n {
            match self
                .sys
                .claim(pick.wrapping_add(i as u32), &t.nodes, &[NodeState::Up])
            {
                Some(node) => nodes.push(node),
                None => {
                    for node in &nodes {
                        self.sys.release(node);
                    }
                    self.skip(what, "no running node free to remove");
                    return None;
                }
            }
        }
        Some(nodes)
    }

    fn remove(&self, what: &str, pick: u32, n: usize) {
        let _one = self.sys.migrations.lock();
        let Some(nodes) = self.removable(what, pick, n) else {
            return;
        };
        let jobs: Vec<(&str, String)> = nodes.iter().map(|n| ("remove", n.clone())).collect();
        self.coordinate(what, &jobs);
        self.settle_nodes(&nodes);
    }

    fn coordinator_kill(&self, add: bool, pick: u32, after_ms: u32, abort: bool) {
        let what = "coordinator-kill";
        let _one = self.sys.migrations.lock();
        let (verb, node) = if add {
            if self.sys.live_nodes() + 1 > self.max_live {
                return self.skip(
                    what,
                    &format!("{} nodes run already", self.sys.live_nodes()),
                );
            }
            match self.sys.start_node() {
                Ok(n) => ("add", n),
                Err(e) => return self.record(self.clock.now_ns(), what, "", false, e),
            }
        } else {
            match self.removable(what, pick, 1) {
                Some(mut n) => ("remove", n.remove(0)),
                None => return,
            }
        };
        let start = self.clock.now_ns();
        let args = [verb, node.as_str()];
        let id = match self.sys.coordinator_start(&args) {
            Ok(id) => id,
            Err(e) => {
                self.record(start, what, &node, false, e);
                return self.settle_nodes(&[node]);
            }
        };
        // The coordinator dies `after_ms` after its migration shows in the topology (or
        // once it ended by itself).
        let shows = Instant::now() + Duration::from_secs(10);
        let mut ended = None;
        while Instant::now() < shows {
            if let Some(r) = self.sys.coordinator_poll(id, &args) {
                ended = Some(r);
                break;
            }
            if matches!(self.sys.topology(), Ok(t) if t.migration.is_some()) {
                break;
            }
            // Polling the topology for the migration's start: a bounded wait.
            std::thread::sleep(Duration::from_millis(10));
        }
        if ended.is_none() {
            std::thread::sleep(Duration::from_millis(after_ms.into()));
            ended = self.sys.coordinator_kill(id, &args);
        }
        let killed = ended.is_none();
        let phase = self
            .sys
            .topology()
            .ok()
            .and_then(|t| t.migration)
            .map(|m| m.phase);
        let detail = if killed {
            format!(
                "killed `kvlab cluster {verb}` {after_ms} ms into its migration ({})",
                match phase {
                    Some(Phase::Copy) => "copying",
                    Some(Phase::Handoff) => "in its hand-off",
                    None => "which had ended",
                }
            )
        } else {
            let (ok, said) = ended.clone().unwrap_or_default();
            format!(
                "not killed: `kvlab cluster {verb}` ended first ({}): {said}",
                if ok { "done" } else { "failed" }
            )
        };
        let ok = killed || ended.is_some_and(|(ok, _)| ok);
        self.record(start, what, &node, ok, detail);
        if phase.is_some() {
            let start = self.clock.now_ns();
            if abort {
                let (ok, said) = self.sys.coordinator(&["abort"]);
                self.record(start, "abort", "", ok, said);
                if ok {
                    return self.settle_nodes(&[node]);
                }
            }
            let start = self.clock.now_ns();
            let (ok, said) = self.sys.coordinator(&["resume"]);
            self.record(start, "resume", "", ok, said);
        }
        self.settle_nodes(&[node]);
    }

    /// After the run: continues, restarts and resumes everything, and waits until the
    /// cluster is at rest (no migration, every ring node at the topology's epoch), for at
    /// most `limit`.
    pub fn heal(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let start = self.clock.now_ns();
        let problems = self.sys.revive();
        self.record(
            start,
            "revive",
            "",
            problems.is_empty(),
            if problems.is_empty() {
                "every node and etcd member running".into()
            } else {
                problems.join("; ")
            },
        );
        let Some(_one) = self.sys.migrations.try_lock_until(deadline) else {
            return Err("a membership change of the nemesis did not end".into());
        };
        let healing = self.clock.now_ns();
        let mut resumes = 0;
        let mut pause = Duration::from_millis(10);
        loop {
            let why = match self.sys.settled() {
                Ok(()) => {
                    self.record(healing, "heal", "", true, "the cluster is at rest".into());
                    return Ok(());
                }
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                self.record(healing, "heal", "", false, why.clone());
                return Err(format!("the cluster did not come to rest: {why}"));
            }
            if let Ok(Some(m)) = self.sys.topology().map(|t| t.migration) {
                if resumes < 3 {
                    resumes += 1;
                    let s = self.clock.now_ns();
                    let (ok, said) = self.sys.coordinator(&["resume"]);
                    self.record(s, "resume", "", ok, said);
                    if !ok && m.phase == Phase::Copy {
                        let s = self.clock.now_ns();
                        let (ok, said) = self.sys.coordinator(&["abort"]);
                        self.record(s, "abort", "", ok, said);
                    }
                    continue;
                }
            }
            // Waiting for the nodes to take up the last epoch: a bounded back-off.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}
