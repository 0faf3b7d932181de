//! Full linearizability of one key's history: is there one order of its operations, each
//! placed somewhere between its invoke and its completion, in which every read returns the
//! value of the write before it (a miss before any write)? The search is the Wing–Gong
//! algorithm with Lowe's memoisation, from `todc-utils` (`WGLChecker`), over a register of
//! unique values.
//!
//! The history is prepared for the search as Jepsen's checkers prepare theirs:
//!
//! - reads that did not end `ok` are dropped (they returned nothing);
//! - a write that did not end `ok` may have taken effect at any time after its invoke, or
//!   never: one whose value nobody read is dropped (never taking effect is always a valid
//!   choice for it), one whose value was read stays with its completion pushed to the end
//!   of time.
//!
//! The search is exponential in the number of operations open at once, and writes of
//! unknown effect that were read stay open to the end; a key with more than [`MAX_OPEN`]
//! of those, or more than [`MAX_OPS`] operations, is skipped and reported as such rather
//! than searched for minutes.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use todc_utils::linearizability::history::{Action, History};
use todc_utils::linearizability::WGLChecker;
use todc_utils::specifications::Specification;

use crate::history::{Op, OpKind, Outcome};

/// The most operations of one key the search takes on.
pub const MAX_OPS: usize = 1500;

/// The most writes of unknown effect (read by someone, so open to the end) one key's search
/// takes on.
pub const MAX_OPEN: usize = 6;

/// What the search says of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A linearization exists.
    Linearizable,
    /// None exists.
    NotLinearizable,
    /// Not searched, for this reason.
    Skipped(String),
}

/// The search's results over a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Keys whose history has a linearization.
    pub linearizable: u64,
    /// Keys not searched because an anomaly of the checker already shows that none exists.
    pub shown_by_anomaly: u64,
    /// Keys the search found not linearizable while no anomaly of the checker showed it.
    pub not_linearizable: Vec<String>,
    /// Keys not searched, with the reason.
    pub skipped: Vec<(String, String)>,
}

impl Summary {
    /// Adds one key: searched unless `flagged` (an anomaly already shows it).
    pub fn add(&mut self, key: &str, ops: &[&Op], flagged: bool) {
        if flagged {
            self.shown_by_anomaly += 1;
            return;
        }
        match check_key(ops) {
            Verdict::Linearizable => self.linearizable += 1,
            Verdict::NotLinearizable => self.not_linearizable.push(key.to_string()),
            Verdict::Skipped(why) => self.skipped.push((key.to_string(), why)),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum RegisterOp {
    /// A read and what it returned (an id of a value; `None`: a miss).
    Read(Option<u32>),
    /// A write of a value (its id).
    Write(u32),
}

/// A register of unique values, empty at first.
struct Register;

impl Specification for Register {
    type State = Option<u32>;
    type Operation = RegisterOp;

    fn init() -> Self::State {
        None
    }

    fn apply(op: &Self::Operation, state: &Self::State) -> (bool, Self::State) {
        match op {
            RegisterOp::Read(v) => (v == state, *state),
            RegisterOp::Write(v) => (true, Some(*v)),
        }
    }
}

/// Searches one key's operations (all of the same key, in any order).
pub fn check_key<'a>(ops: &[&'a Op]) -> Verdict {
    let read: HashSet<&'a str> = ops
        .iter()
        .filter(|o| o.kind == OpKind::Read && o.outcome == Outcome::Ok)
        .filter_map(|o| o.value.as_deref())
        .collect();
    let mut ids: HashMap<&str, u32> = HashMap::new();
    let mut id_of = |v: &'a str| {
        let n = ids.len() as u32;
        *ids.entry(v).or_insert(n)
    };
    // (invoke, complete, operation)
    let mut entries: Vec<(u64, u64, RegisterOp)> = Vec::new();
    let mut open = 0;
    for o in ops {
        match (o.kind, o.outcome, o.value.as_deref()) {
            (OpKind::Write, Outcome::Ok, Some(v)) => {
                entries.push((o.invoke_ns, o.complete_ns, RegisterOp::Write(id_of(v))))
            }
            (OpKind::Write, _, Some(v)) if read.contains(v) => {
                open += 1;
                entries.push((o.invoke_ns, u64::MAX, RegisterOp::Write(id_of(v))))
            }
            (OpKind::Read, Outcome::Ok, v) => entries.push((
                o.invoke_ns,
                o.complete_ns,
                RegisterOp::Read(v.map(&mut id_of)),
            )),
            _ => {}
        }
    }
    if entries.is_empty() {
        return Verdict::Linearizable;
    }
    if entries.len() > MAX_OPS {
        return Verdict::Skipped(format!(
            "{} operations (the search takes at most {MAX_OPS})",
            entries.len()
        ));
    }
    if open > MAX_OPEN {
        return Verdict::Skipped(format!(
            "{open} writes of unknown effect were read (the search takes at most {MAX_OPEN})"
        ));
    }
    // Calls and responses in time order; at equal times calls first, so that operations
    // that touch are taken as concurrent. Each operation is its own process: a client
    // whose request timed out went on with another while the first may still be open.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(entries.len() * 2);
    for (i, (invoke, complete, _)) in entries.iter().enumerate() {
        events.push((*invoke, false, i));
        events.push(((*complete).max(*invoke), true, i));
    }
    events.sort_unstable();
    let actions = events
        .into_iter()
        .map(|(_, response, i)| {
            let op = entries[i].2;
            (
                i,
                if response {
                    Action::Response(op)
                } else {
                    Action::Call(op)
                },
            )
        })
        .collect();
    if WGLChecker::<Register>::is_linearizable(History::from_actions(actions)) {
        Verdict::Linearizable
    } else {
        Verdict::NotLinearizable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: OpKind, value: Option<&str>, at: (u64, u64), outcome: Outcome) -> Op {
        Op {
            client: 0,
            key: "k".into(),
            kind,
            value: value.map(str::to_string),
            invoke_ns: at.0,
            complete_ns: at.1,
            outcome,
            final_read: false,
            error: None,
        }
    }

    #[test]
    fn a_sequential_history_is_linearizable_and_a_reordered_one_is_not() {
        let w1 = op(OpKind::Write, Some("a"), (0, 10), Outcome::Ok);
        let w2 = op(OpKind::Write, Some("b"), (20, 30), Outcome::Ok);
        let r = op(OpKind::Read, Some("b"), (40, 50), Outcome::Ok);
        assert_eq!(check_key(&[&w1, &w2, &r]), Verdict::Linearizable);
        let stale = op(OpKind::Read, Some("a"), (40, 50), Outcome::Ok);
        assert_eq!(check_key(&[&w1, &w2, &stale]), Verdict::NotLinearizable);
        let miss = op(OpKind::Read, None, (5, 8), Outcome::Ok);
        assert_eq!(check_key(&[&w1, &miss]), Verdict::Linearizable);
    }

    #[test]
    fn too_many_open_writes_are_skipped_not_searched() {
        let mut ops = Vec::new();
        for i in 0..=MAX_OPEN {
            let v = format!("v{i}");
            ops.push(op(
                OpKind::Write,
                Some(&v),
                (i as u64, i as u64 + 1),
                Outcome::Unknown,
            ));
            ops.push(op(
                OpKind::Read,
                Some(&v),
                (100 + i as u64, 101 + i as u64),
                Outcome::Ok,
            ));
        }
        let refs: Vec<&Op> = ops.iter().collect();
        assert!(matches!(check_key(&refs), Verdict::Skipped(_)));
        // Unread ones are simply dropped.
        let unread: Vec<&Op> = ops.iter().filter(|o| o.kind == OpKind::Write).collect();
        assert_eq!(check_key(&unread), Verdict::Linearizable);
    }
}
