//! A run's history: one record per client operation and one per nemesis action, on one
//! timeline (nanoseconds since the run's start), written as JSON lines:
//!
//! ```text
//! {"type":"op","client":2,"key":"fk:17","kind":"write","value":"c2-311","invoke_ns":…,"complete_ns":…,"outcome":"ok"}
//! {"type":"op","client":0,"key":"fk:17","kind":"read","value":null,"invoke_ns":…,"complete_ns":…,"outcome":"ok"}
//! {"type":"nemesis","start_ns":…,"end_ns":…,"what":"pause","target":"127.0.0.1:7102","ok":true,"detail":"1200 ms"}
//! ```
//!
//! Every value a client writes is unique (`c<client>-<seq>`), so a read names the write it
//! saw. An operation's outcome is `ok` (acknowledged), `failed` (certainly not applied: the
//! request was never sent, or the server said it did not store it) or `unknown` (sent, and
//! then a timeout or a lost connection: it may or may not have taken effect).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::FaultsError;

/// The run's clock: nanoseconds since its start, the same for every thread.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock that starts now.
    pub fn start() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    /// Nanoseconds since the start.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The instant `ns` after the start.
    pub fn at(&self, ns: u64) -> Instant {
        self.start + Duration::from_nanos(ns)
    }
}

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// `set` of a unique value.
    Write,
    /// `get`.
    Read,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Acknowledged: a write was stored, a read returned a value or a miss.
    Ok,
    /// Certainly not applied (never sent, or refused by the server).
    Failed,
    /// Sent, then no answer (a timeout, a lost connection, an error after sending): it may
    /// or may not have taken effect.
    Unknown,
}

/// One client operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// The client (thread) that made it.
    pub client: u32,
    /// The key.
    pub key: String,
    /// Write or read.
    pub kind: OpKind,
    /// A write: the value written. A read: the value read (`None`: a miss, or no answer).
    pub value: Option<String>,
    /// When the request was about to be sent (ns since the run's start).
    pub invoke_ns: u64,
    /// When its answer (or its failure) came back.
    pub complete_ns: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// One of the reads of every key made once the nemesis stopped and the cluster healed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub final_read: bool,
    /// What went wrong, for an operation that did not end `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Op {
    /// Whether a write may have taken effect without being acknowledged.
    pub fn indefinite(&self) -> bool {
        self.outcome != Outcome::Ok
    }

    /// One line for a human: `client 2 write fk:17 = c2-311 ok [1.204500 s → 1.204870 s]`.
    pub fn describe(&self) -> String {
        let what = match (self.kind, &self.value) {
            (OpKind::Write, Some(v)) => format!("write {} = {v}", self.key),
            (OpKind::Write, None) => format!("write {} = ?", self.key),
            (OpKind::Read, Some(v)) => format!("read {} → {v}", self.key),
            (OpKind::Read, None) if self.outcome == Outcome::Ok => {
                format!("read {} → miss", self.key)
            }
            (OpKind::Read, None) => format!("read {}", self.key),
        };
        format!(
            "client {} {what}{} {:?} [{} → {}]",
            self.client,
            if self.final_read { " (final)" } else { "" },
            self.outcome,
            secs(self.invoke_ns),
            secs(self.complete_ns)
        )
    }
}

/// One action of the nemesis (or of the heal after it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NemesisEvent {
    /// When it began (ns since the run's start).
    pub start_ns: u64,
    /// When it ended.
    pub end_ns: u64,
    /// What it was: `kill`, `pause`, `add`, `remove`, `coordinator-kill`, `etcd-kill`,
    /// `flush`, `rejoin`, `heal`, …
    pub what: String,
    /// Its target (a node, an etcd member), or empty.
    pub target: String,
    /// Whether it did what it meant to.
    pub ok: bool,
    /// Details: how long a pause lasted, what a coordinator said, why it was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A line of a history file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Record {
    /// A client operation.
    Op(Op),
    /// A nemesis action.
    Nemesis(NemesisEvent),
}

/// A whole run's records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// Client operations (final reads included).
    pub ops: Vec<Op>,
    /// Nemesis actions.
    pub nemesis: Vec<NemesisEvent>,
}

impl History {
    /// Writes every record as one JSON line, in order of start time.
    pub fn write_jsonl(&self, mut w: impl Write) -> std::io::Result<()> {
        let mut order: Vec<(u64, usize, bool)> = self
            .ops
            .iter()
            .enumerate()
            .map(|(i, o)| (o.invoke_ns, i, true))
            .chain(
                self.nemesis
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.start_ns, i, false)),
            )
            .collect();
        order.sort_unstable();
        for (_, i, is_op) in order {
            let line = if is_op {
                serde_json::to_string(&RecordRef::Op(&self.ops[i]))
            } else {
                serde_json::to_string(&RecordRef::Nemesis(&self.nemesis[i]))
            }
            .map_err(std::io::Error::other)?;
            w.write_all(line.as_bytes())?;
            w.write_all(b"\n")?;
        }
        w.flush()
    }

    /// Reads what [`History::write_jsonl`] wrote (`what` names the source in errors).
    pub fn read_jsonl(r: impl BufRead, what: &str) -> Result<History, FaultsError> {
        let mut h = History::default();
        for (n, line) in r.lines().enumerate() {
            let line = line.map_err(|source| FaultsError::Io {
                what: what.to_string(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str(&line).map_err(|source| FaultsError::Json {
                what: what.to_string(),
                line: n + 1,
                source,
            })? {
                Record::Op(o) => h.ops.push(o),
                Record::Nemesis(e) => h.nemesis.push(e),
            }
        }
        Ok(h)
    }

    /// A timeline for a human: every nemesis action, and per second the operations that
    /// began in it (ok / failed / unknown).
    pub fn timeline(&self) -> String {
        let mut per_s: BTreeMap<u64, [u64; 3]> = BTreeMap::new();
        for o in &self.ops {
            let c = per_s.entry(o.invoke_ns / 1_000_000_000).or_default();
            c[match o.outcome {
                Outcome::Ok => 0,
                Outcome::Failed => 1,
                Outcome::Unknown => 2,
            }] += 1;
        }
        let mut lines: Vec<(u64, u8, String)> = Vec::new();
        for (s, c) in &per_s {
            lines.push((
                s * 1_000_000_000,
                0,
                format!(
                    "{:>10}  ops in this second: {} ok, {} failed, {} unknown",
                    secs(s * 1_000_000_000),
                    c[0],
                    c[1],
                    c[2]
                ),
            ));
        }
        for e in &self.nemesis {
            let mut l = format!(
                "{:>10}  {} {}{} ({:.3} s){}",
                secs(e.start_ns),
                e.what,
                e.target,
                if e.ok { "" } else { " FAILED" },
                e.end_ns.saturating_sub(e.start_ns) as f64 / 1e9,
                e.detail
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            );
            l = l.replace('\n', " ");
            lines.push((e.start_ns, 1, l));
        }
        lines.sort();
        let mut out = String::from("time (s since the run's start)\n");
        for (_, _, l) in lines {
            let _ = writeln!(out, "{l}");
        }
        out
    }
}

/// A record by reference, to write without cloning.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum RecordRef<'a> {
    Op(&'a Op),
    Nemesis(&'a NemesisEvent),
}

/// Nanoseconds as seconds with microseconds (`1.204500 s`).
pub fn secs(ns: u64) -> String {
    if ns == u64::MAX {
        return "∞".into();
    }
    format!(
        "{}.{:06} s",
        ns / 1_000_000_000,
        (ns % 1_000_000_000) / 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_as_json_lines_in_time_order() {
        let h = History {
            ops: vec![
                Op {
                    client: 1,
                    key: "fk:1".into(),
                    kind: OpKind::Read,
                    value: None,
                    invoke_ns: 30,
                    complete_ns: 40,
                    outcome: Outcome::Ok,
                    final_read: true,
                    error: None,
                },
                Op {
                    client: 0,
                    key: "fk:1".into(),
                    kind: OpKind::Write,
                    value: Some("c0-1".into()),
                    invoke_ns: 10,
                    complete_ns: 20,
                    outcome: Outcome::Unknown,
                    final_read: false,
                    error: Some("timed out".into()),
                },
            ],
            nemesis: vec![NemesisEvent {
                start_ns: 15,
                end_ns: 25,
                what: "pause".into(),
                target: "127.0.0.1:1".into(),
                ok: true,
                detail: Some("10 ms".into()),
            }],
        };
        let mut buf = Vec::new();
        h.write_jsonl(&mut buf).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        let types: Vec<&str> = text.lines().map(|l| l.split(',').next().unwrap()).collect();
        assert_eq!(
            types,
            [
                "{\"type\":\"op\"",
                "{\"type\":\"nemesis\"",
                "{\"type\":\"op\""
            ]
        );
        let back = History::read_jsonl(&buf[..], "test").unwrap();
        assert_eq!(back.nemesis, h.nemesis);
        assert_eq!(back.ops.len(), 2);
        assert!(back.ops.contains(&h.ops[0]) && back.ops.contains(&h.ops[1]));
        assert!(h.timeline().contains("pause 127.0.0.1:1"));
        let err = History::read_jsonl(&b"{\"type\":\"op\"}\n"[..], "bad").unwrap_err();
        assert!(err.to_string().starts_with("bad: line 1"), "{err}");
    }
}
