//! The checker: each key is a register whose every written value is unique, so a read names
//! the one write it saw. Per key, three anomalies are looked for, each in O(n log n):
//!
//! - **lost write**: the key's final read (made after the nemesis stopped and the cluster
//!   healed) does not see the last acknowledged write, nor a write concurrent with or later
//!   than it. Precisely: it returns the value of write `w` (or a miss) although some
//!   acknowledged write `w2` was invoked after `w` completed (for a miss: although any
//!   write was acknowledged).
//! - **stale read**: any other read that returns a value older than a write completed
//!   before the read began: an acknowledged `w2` completed before the read's invoke and was
//!   itself invoked after the returned value's write completed. A miss is stale when any
//!   acknowledged write completed before the read began (these runs have no eviction and
//!   no TTL).
//! - **never written**: a read returns a value no one wrote to that key (or wrote only
//!   after the read had completed).
//!
//! A write that did not end `ok` (failed or unknown) may have taken effect at any time
//! after its invoke: it never makes another read stale, a read may see it, and it counts as
//! written. Failed and unknown reads tell nothing and are only counted.
//!
//! Under write policy `owner` a cluster may lose an acknowledged write that nobody read
//! (its owner died before its copy landed); what it still promises is that a value read is
//! never undone. [`owner_view`] checks that promise: it sets aside the acknowledged writes
//! whose value no read returned, and the checks above then hold for the rest.
//!
//! On top of these, [`crate::linear`] searches each key's whole history for a
//! linearization (keys already caught by an anomaly above are not searched: each of these
//! anomalies is itself a proof that no linearization exists).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::history::{secs, Op, OpKind, Outcome};
use crate::linear;

/// What kind of anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// The final read lost an acknowledged write.
    LostWrite,
    /// A read returned a value older than an acknowledged write before it.
    StaleRead,
    /// A read returned a value that was never written to its key.
    NeverWritten,
}

/// One anomaly and the operations that show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    /// Its kind.
    pub kind: AnomalyKind,
    /// The key.
    pub key: String,
    /// Why it is one, in words.
    pub why: String,
    /// The read, the write it saw (if any), and the acknowledged write(s) it missed.
    pub ops: Vec<Op>,
}

/// How many anomalies of each kind a report lists in full (it counts all of them).
pub const LISTED_PER_KIND: usize = 100;

/// What the checker found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Operations checked (final reads included).
    pub ops: u64,
    /// Of which acknowledged.
    pub ok: u64,
    /// Of which certainly not applied.
    pub failed: u64,
    /// Of which of unknown effect.
    pub unknown: u64,
    /// Writes (any outcome).
    pub writes: u64,
    /// Reads (any outcome, final reads included).
    pub reads: u64,
    /// Keys with at least one operation.
    pub keys: u64,
    /// Final reads that returned (`ok`).
    pub final_reads: u64,
    /// Lost writes found.
    pub lost_writes: u64,
    /// Stale reads found.
    pub stale_reads: u64,
    /// Reads of values never written.
    pub never_written: u64,
    /// Keys with an acknowledged write whose final read never returned (not verified).
    pub unverified_keys: Vec<String>,
    /// Write policy `owner`: acknowledged writes that no read returned, set aside before
    /// the checks ([`owner_view`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub set_aside: u64,
    /// The anomalies (at most [`LISTED_PER_KIND`] of each kind).
    pub anomalies: Vec<Anomaly>,
    /// The linearizability search of each key's history.
    pub linearizability: linear::Summary,
}

impl Report {
    /// All anomalies found: lost writes, stale reads, values never written, and keys whose
    /// history the search alone found not linearizable.
    pub fn anomaly_count(&self) -> u64 {
        self.lost_writes
            + self.stale_reads
            + self.never_written
            + self.linearizability.not_linearizable.len() as u64
    }

    /// The verdict as an exit status: 1 when anomalies were found; else 2 when keys with an
    /// acknowledged write were never read back (a loss there would go unseen, so the
    /// history proves nothing about them); else 0.
    pub fn exit_code(&self) -> i32 {
        verdict_code(
            self.anomaly_count(),
            self.unverified_keys.len() as u64,
            false,
        )
    }

    fn add(&mut self, a: Anomaly) {
        let n = match a.kind {
            AnomalyKind::LostWrite => &mut self.lost_writes,
            AnomalyKind::StaleRead => &mut self.stale_reads,
            AnomalyKind::NeverWritten => &mut self.never_written,
        };
        *n += 1;
        if *n as usize <= LISTED_PER_KIND {
            self.anomalies.push(a);
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The history as write policy `owner` promises it: every operation but the acknowledged
/// writes whose value no acknowledged read returned (such a write may have been lost with
/// its owner; one that was read may not be), and how many were set aside. Checking this
/// view is checking that no value read is ever undone, and that no value read was never
/// written.
pub fn owner_view(ops: &[Op]) -> (Vec<Op>, u64) {
    let read: std::collections::HashSet<(&str, &str)> = ops
        .iter()
        .filter(|o| o.kind == OpKind::Read && o.outcome == Outcome::Ok)
        .filter_map(|o| Some((o.key.as_str(), o.value.as_deref()?)))
        .collect();
    let kept = |o: &&Op| {
        o.kind == OpKind::Read
            || o.outcome != Outcome::Ok
            || o.value
                .as_deref()
                .is_some_and(|v| read.contains(&(o.key.as_str(), v)))
    };
    let view: Vec<Op> = ops.iter().filter(kept).cloned().collect();
    let set_aside = (ops.len() - view.len()) as u64;
    (view, set_aside)
}

/// Checks a history's operations (in any order).
pub fn check(ops: &[Op]) -> Report {
    let mut r = Report {
        ops: ops.len() as u64,
        ..Report::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for o in ops {
        match o.outcome {
            Outcome::Ok => r.ok += 1,
            Outcome::Failed => r.failed += 1,
            Outcome::Unknown => r.unknown += 1,
        }
        match o.kind {
            OpKind::Write => r.writes += 1,
            OpKind::Read => r.reads += 1,
        }
        if o.final_read && o.kind == OpKind::Read && o.outcome == Outcome::Ok {
            r.final_reads += 1;
        }
        by_key.entry(o.key.as_str()).or_default().push(o);
    }
    r.keys = by_key.len() as u64;
    for (key, ops) in &by_key {
        let before = r.lost_writes + r.stale_reads + r.never_written;
        check_key(key, ops, &mut r);
        let flagged = r.lost_writes + r.stale_reads + r.never_written > before;
        r.linearizability.add(key, ops, flagged);
    }
    r
}

/// When a write may have taken effect at the latest: its completion if acknowledged,
/// otherwise any time.
fn effective_complete(w: &Op) -> u64 {
    if w.outcome == Outcome::Ok {
        w.complete_ns
    } else {
        u64::MAX
    }
}

/// One key's writes, indexed for the questions the checks ask.
struct KeyIndex<'a> {
    /// Every write (any outcome) by its value.
    by_value: HashMap<&'a str, &'a Op>,
    /// Acknowledged writes by invoke time.
    by_invoke: Vec<&'a Op>,
    /// `suffix_min[i]`: the index in `by_invoke` of the write that completed first among
    /// `by_invoke[i..]`.
    suffix_min: Vec<usize>,
    /// Acknowledged writes by completion time.
    by_complete: Vec<&'a Op>,
}

impl<'a> KeyIndex<'a> {
    fn new(ops: &[&'a Op]) -> KeyIndex<'a> {
        let mut by_value = HashMap::new();
        let mut acked = Vec::new();
        for o in ops.iter().filter(|o| o.kind == OpKind::Write) {
            if let Some(v) = &o.value {
                by_value.entry(v.as_str()).or_insert(*o);
            }
            if o.outcome == Outcome::Ok {
                acked.push(*o);
            }
        }
        let mut by_invoke = acked.clone();
        by_invoke.sort_by_key(|w| w.invoke_ns);
        let mut suffix_min = vec![0; by_invoke.len()];
        for i in (0..by_invoke.len()).rev() {
            suffix_min[i] = if i + 1 < by_invoke.len()
                && by_invoke[suffix_min[i + 1]].complete_ns < by_invoke[i].complete_ns
            {
                suffix_min[i + 1]
            } else {
                i
            };
        }
        let mut by_complete = acked;
        by_complete.sort_by_key(|w| w.complete_ns);
        KeyIndex {
            by_value,
            by_invoke,
            suffix_min,
            by_complete,
        }
    }

    /// An acknowledged write invoked after `after` that completed before `before` (the
    /// first of them to complete), if any.
    fn superseding(&self, after: u64, before: u64) -> Option<&'a Op> {
        let i = self.by_invoke.partition_point(|w| w.invoke_ns <= after);
        let w = self.by_invoke.get(self.suffix_min.get(i).copied()?)?;
        (w.complete_ns < before).then_some(*w)
    }

    /// The acknowledged write that completed last before `t`.
    fn last_acked_before(&self, t: u64) -> Option<&'a Op> {
        let i = self.by_complete.partition_point(|w| w.complete_ns < t);
        i.checked_sub(1).map(|i| self.by_complete[i])
    }
}

/// What a history's check gives as an exit status: anomalies found: 1; a run that did not
/// go as planned, or keys it could not verify: 2; else 0.
pub fn verdict_code(anomalies: u64, unverified_keys: u64, failed: bool) -> i32 {
    if anomalies > 0 {
        1
    } else if failed || unverified_keys > 0 {
        2
    } else {
        0
    }
}

/// The line that says a check could not verify keys.
pub fn unverified_line(keys: u64) -> String {
    format!(
        "could not verify {keys} keys: written (acknowledged), never read back — a loss there \
         would go unseen"
    )
}

fn check_key(key: &str, ops: &[&Op], r: &mut Report) {
    let idx = KeyIndex::new(ops);
    let mut acked_write = false;
    let mut final_ok = false;
    for o in ops {
        if o.kind == OpKind::Write && o.outcome == Outcome::Ok {
            acked_write = true;
        }
        if o.kind != OpKind::Read || o.outcome != Outcome::Ok {
            continue;
        }
        final_ok |= o.final_read;
        if let Some(a) = judge_read(key, o, &idx) {
            r.add(a);
        }
    }
    if acked_write && !final_ok {
        r.unverified_keys.push(key.to_string());
    }
}

/// The anomaly a read (acknowledged) shows, if any.
fn judge_read(key: &str, read: &Op, idx: &KeyIndex<'_>) -> Option<Anomaly> {
    let kind = if read.final_read {
        AnomalyKind::LostWrite
    } else {
        AnomalyKind::StaleRead
    };
    let anomaly = |kind, why: String, ops: Vec<&Op>| Anomaly {
        kind,
        key: key.to_string(),
        why,
        ops: ops.into_iter().cloned().collect(),
    };
    let Some(value) = &read.value else {
        // A miss: stale (or lost) if any acknowledged write completed before it began.
        let last = idx.last_acked_before(read.invoke_ns)?;
        let why = format!(
            "{} a miss although write {} was acknowledged at {}, before the read began at {}",
            if read.final_read {
                "the final read found"
            } else {
                "a read returned"
            },
            last.value.as_deref().unwrap_or("?"),
            secs(last.complete_ns),
            secs(read.invoke_ns)
        );
        return Some(anomaly(kind, why, vec![read, last]));
    };
    let Some(w) = idx.by_value.get(value.as_str()) else {
        let why = format!("read {value}, which no client ever wrote to {key}");
        return Some(anomaly(AnomalyKind::NeverWritten, why, vec![read]));
    };
    if w.invoke_ns > read.complete_ns {
        let why = format!(
            "read {value} (ended {}) before its write began ({})",
            secs(read.complete_ns),
            secs(w.invoke_ns)
        );
        return Some(anomaly(AnomalyKind::NeverWritten, why, vec![read, w]));
    }
    let w2 = idx.superseding(effective_complete(w), read.invoke_ns)?;
    let mut ops = vec![read, *w, w2];
    let last = idx.last_acked_before(read.invoke_ns);
    if let Some(last) = last.filter(|l| *l != w2) {
        ops.push(last);
    }
    let why = format!(
        "{} {value} (written {} → {}) although {} was written after it ({} → {}), before \
         the read began at {}{}",
        if read.final_read {
            "the final read found"
        } else {
            "a read returned"
        },
        secs(w.invoke_ns),
        secs(w.complete_ns),
        w2.value.as_deref().unwrap_or("?"),
        secs(w2.invoke_ns),
        secs(w2.complete_ns),
        secs(read.invoke_ns),
        last.filter(|l| *l != w2)
            .map(|l| format!(
                "; the last acknowledged write then was {}",
                l.value.as_deref().unwrap_or("?")
            ))
            .unwrap_or_default()
    );
    Some(anomaly(kind, why, ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history written as one op per line: `client kind value invoke complete outcome`
    /// with times in ms, `-` for a miss, `!` before `read` for a final read.
    fn ops(text: &str) -> Vec<Op> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let (final_read, kind) = match w[1] {
                    "write" => (false, OpKind::Write),
                    "read" => (false, OpKind::Read),
                    "!read" => (true, OpKind::Read),
                    k => panic!("kind {k}"),
                };
                let ms = |s: &str| -> u64 {
                    if s == "inf" {
                        u64::MAX
                    } else {
                        s.parse::<u64>().unwrap() * 1_000_000
                    }
                };
                Op {
                    client: w[0].parse().unwrap(),
                    key: "k".into(),
                    kind,
                    value: (w[2] != "-").then(|| w[2].to_string()),
                    invoke_ns: ms(w[3]),
                    complete_ns: ms(w[4]),
                    outcome: match w[5] {
                        "ok" => Outcome::Ok,
                        "failed" => Outcome::Failed,
                        "unknown" => Outcome::Unknown,
                        o => panic!("outcome {o}"),
                    },
                    final_read,
                    error: None,
                }
            })
            .collect()
    }

    fn kinds(r: &Report) -> Vec<AnomalyKind> {
        r.anomalies.iter().map(|a| a.kind).collect()
    }

    #[track_caller]
    fn clean(text: &str) {
        let r = check(&ops(text));
        assert!(r.anomalies.is_empty(), "{:#?}", r.anomalies);
        assert!(
            r.linearizability.not_linearizable.is_empty(),
            "{:?}",
            r.linearizability
        );
        assert_eq!(r.linearizability.linearizable, 1, "{:?}", r.linearizability);
    }

    /// Write policy `owner`: an acknowledged write nobody read may be lost (it is set
    /// aside), but a value once read may not be undone — by a later read or the final one.
    #[test]
    fn under_write_policy_owner_only_a_value_read_must_not_be_undone() {
        let lost_unread = ops("
            0 write a 0 10 ok
            1 write b 20 30 ok
            9 !read a 100 110 ok
        ");
        assert_eq!(kinds(&check(&lost_unread)), [AnomalyKind::LostWrite]);
        let (view, set_aside) = owner_view(&lost_unread);
        assert_eq!(set_aside, 1, "b was acknowledged and never read");
        let r = check(&view);
        assert!(r.anomalies.is_empty(), "{:#?}", r.anomalies);
        assert_eq!(r.linearizability.linearizable, 1, "{:?}", r.linearizability);
        let undone = ops("
            0 write a 0 10 ok
            1 write b 20 30 ok
            2 read b 40 50 ok
            9 !read a 100 110 ok
        ");
        let (view, set_aside) = owner_view(&undone);
        assert_eq!(set_aside, 0);
        assert_eq!(kinds(&check(&view)), [AnomalyKind::LostWrite]);
        let read_undone = ops("
            0 write a 0 10 ok
            1 write b 20 30 ok
            2 read b 40 50 ok
            3 read a 60 70 ok
            9 !read b 100 110 ok
        ");
        let (view, _) = owner_view(&read_undone);
        assert_eq!(kinds(&check(&view)), [AnomalyKind::StaleRead]);
    }

    #[test]
    fn the_final_read_must_see_the_last_acknowledged_write() {
        // An older value at the end.
        let r = check(&ops("
            0 write a 0 10 ok
            1 write b 20 30 ok
            9 !read a 100 110 ok
        "));
        assert_eq!(kinds(&r), [AnomalyKind::LostWrite]);
        assert_eq!(r.lost_writes, 1);
        let a = &r.anomalies[0];
        assert_eq!(
            a.ops.len(),
            3,
            "the read, the write it saw, the one it missed"
        );
        assert!(a.why.contains("b was written after it"), "{}", a.why);
        // Nothing at the end.
        let r = check(&ops("
            0 write a 0 10 ok
            9 !read - 100 110 ok
        "));
        assert_eq!(kinds(&r), [AnomalyKind::LostWrite]);
        assert_eq!(
            r.anomaly_count(),
            1,
            "the search adds nothing the anomaly shows"
        );
    }

    #[test]
    fn a_read_older_than_a_completed_write_is_stale() {
        let r = check(&ops("
            0 write a 0 10 ok
            0 write b 20 30 ok
            1 read a 40 50 ok
            1 read b 60 70 ok
            9 !read b 100 110 ok
        "));
        assert_eq!(kinds(&r), [AnomalyKind::StaleRead]);
        assert_eq!(r.anomalies[0].ops[0].invoke_ns, 40_000_000);
        // A miss after an acknowledged write.
        let r = check(&ops("
            0 write a 0 10 ok
            1 read - 40 50 ok
            9 !read a 100 110 ok
        "));
        assert_eq!(kinds(&r), [AnomalyKind::StaleRead]);
        // Even when the newer write came from a write that failed-or-unknown first: an
        // acknowledged one after the value's write completed is what counts.
        let r = check(&ops("
            0 write a 0 10 ok
            2 write x 5 8 unknown
            0 write b 20 30 ok
            1 read a 40 50 ok
            9 !read b 100 110 ok
        "));
        assert_eq!(kinds(&r), [AnomalyKind::StaleRead]);
    }

    #[test]
    fn a_value_never_written_is_flagged() {
        let r = check(&ops("
            0 write a 0 10 ok
            1 read zz 20 30 ok
            9 !read a 100 110 ok
        "));
        assert_eq!(kinds(&r), [AnomalyKind::NeverWritten]);
        // Read before its write began.
        let r = check(&ops("
            1 read a 0 5 ok
            0 write a 10 20 ok
            9 !read a 100 110 ok
        "));
        assert_eq!(kinds(&r), [AnomalyKind::NeverWritten]);
    }

    #[test]
    fn concurrent_writes_may_land_in_either_order() {
        for last in ["a", "b"] {
            clean(&format!(
                "
                0 write a 0 50 ok
                1 write b 10 40 ok
                9 !read {last} 100 110 ok
            "
            ));
        }
        // And reads during them may see either, old then new.
        clean(
            "
            0 write o 0 1 ok
            0 write a 10 50 ok
            1 write b 10 50 ok
            2 read o 11 12 ok
            2 read b 13 14 ok
            2 read a 15 16 ok
            9 !read a 100 110 ok
        ",
        );
    }

    #[test]
    fn unknown_writes_may_be_seen_or_not() {
        // Not seen.
        clean(
            "
            0 write a 0 10 ok
            1 write b 20 30 unknown
            9 !read a 100 110 ok
        ",
        );
        // Seen, by a read and at the end, even long after it "completed".
        clean(
            "
            0 write a 0 10 ok
            1 write b 20 30 unknown
            2 read a 40 45 ok
            2 read b 60 70 ok
            9 !read b 100 110 ok
        ",
        );
        // A failed write that nevertheless shows up at the end: not a lost write.
        clean(
            "
            0 write a 0 10 ok
            1 write b 20 30 failed
            9 !read b 100 110 ok
        ",
        );
        // An unknown write seen at the end after a later acknowledged one: it may have
        // taken effect after it.
        clean(
            "
            1 write b 0 5 unknown
            0 write a 20 30 ok
            9 !read b 100 110 ok
        ",
        );
    }

    #[test]
    fn reads_of_a_write_in_flight_are_fine() {
        clean(
            "
            0 write a 0 10 ok
            0 write b 20 80 ok
            1 read b 30 40 ok
            2 read a 35 45 ok
            9 !read b 100 110 ok
        ",
        );
        // A miss before anything was acknowledged.
        clean(
            "
            0 write a 0 10 ok
            1 read - 5 8 ok
            9 !read a 100 110 ok
        ",
        );
    }

    #[test]
    fn failed_reads_tell_nothing_and_keys_without_a_final_read_are_unverified() {
        let r = check(&ops("
            0 write a 0 10 ok
            1 read zz 20 30 unknown
            9 !read - 100 110 failed
        "));
        assert!(r.anomalies.is_empty());
        assert_eq!(r.unverified_keys, ["k"]);
        assert_eq!((r.ok, r.failed, r.unknown), (1, 1, 1));
    }

    #[test]
    fn the_search_catches_what_no_single_read_shows() {
        // Two reads during one write disagree in time: new, then old.
        let r = check(&ops("
            0 write a 0 10 ok
            0 write b 20 80 ok
            1 read b 30 40 ok
            2 read a 50 60 ok
            9 !read b 100 110 ok
        "));
        assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
        assert_eq!(r.linearizability.not_linearizable, ["k"]);
        assert_eq!(r.anomaly_count(), 1);
    }
}
