//! A pipelined stream of storage commands to another node (`cluster import` connections:
//! migrations, hand-overs, resyncs and write-through copies): requests are written in
//! batches and their one-line replies counted back.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use kvlab_client::cluster::resolve;

use crate::clock::now_unix;
use crate::ClusterError;

/// A pipelined connection to a new owner: requests are written in batches and their
/// one-line replies counted back.
///
/// A full batch is written without waiting for its replies: the receiver applies it while
/// the next one is read and encoded here, and the replies are read at [`Pipe::flush`] (the
/// caller's confirmation point) or once [`OWED_MAX`] are owed. Waiting for each 128 KiB
/// batch's replies before writing the next made a copy stop-and-wait: one node streaming
/// its keys to three new owners moved 71–99 MB/s, every batch a round trip.
pub(crate) struct Pipe {
    stream: TcpStream,
    out: Vec<u8>,
    owed: usize,
    inb: Vec<u8>,
    /// Refusals read before the caller's [`Pipe::flush`], which returns them.
    refused: u64,
}

/// Replies owed at most before they are read: their lines (a few dozen bytes each) must
/// fit the socket's receive buffer, or the receiver would block writing them while this
/// side blocks writing requests.
const OWED_MAX: usize = 1024;

/// Bytes queued before they are written.
const BATCH: usize = 128 * 1024;

impl Pipe {
    pub(crate) fn connect(node: &str, timeout: Duration) -> Result<Pipe, ClusterError> {
        let err = |e: std::io::Error| ClusterError::Migration(format!("{node}: {e}"));
        let stream = TcpStream::connect_timeout(
            &resolve(node).map_err(err)?,
            timeout.min(Duration::from_secs(2)),
        )
        .map_err(err)?;
        stream.set_nodelay(true).map_err(err)?;
        stream.set_read_timeout(Some(timeout)).map_err(err)?;
        stream.set_write_timeout(Some(timeout)).map_err(err)?;
        Ok(Pipe {
            stream,
            out: Vec::with_capacity(2 * BATCH),
            owed: 0,
            inb: Vec::with_capacity(64 * 1024),
            refused: 0,
        })
    }

    /// Says `cluster import ID FROM` (its reply is read with the first batch's). The
    /// receiving node hands the connection, with whatever followed the line, to a thread
    /// of its own; nothing waits for that here, so a worker that opens a copy stream
    /// never waits on a peer's worker.
    pub(crate) fn import(mut self, id: u64, from: &str) -> Result<Pipe, ClusterError> {
        self.line(format!("cluster import {id} {from}\r\n").as_bytes())?;
        Ok(self)
    }

    /// A migration stream: `cluster import ID FROM GEN`, where a newer generation from the
    /// same source replaces the older stream at the receiver.
    pub(crate) fn import_generation(
        mut self,
        id: u64,
        from: &str,
        generation: u64,
    ) -> Result<Pipe, ClusterError> {
        self.line(format!("cluster import {id} {from} {generation}\r\n").as_bytes())?;
        Ok(self)
    }

    pub(crate) fn set(
        &mut self,
        key: &[u8],
        flags: u32,
        exptime: u64,
        value: &[u8],
    ) -> Result<(), ClusterError> {
        self.store(b"set ", key, flags, exptime, value)
    }

    /// Like [`Pipe::set`], but the receiver keeps an item it already has (`add`).
    pub(crate) fn add(
        &mut self,
        key: &[u8],
        flags: u32,
        exptime: u64,
        value: &[u8],
    ) -> Result<(), ClusterError> {
        self.store(b"add ", key, flags, exptime, value)
    }

    /// Queues storage command `command` (with its space) for an item.
    fn store(
        &mut self,
        command: &[u8],
        key: &[u8],
        flags: u32,
        exptime: u64,
        value: &[u8],
    ) -> Result<(), ClusterError> {
        if encode_store(&mut self.out, command, key, flags, exptime, value) {
            self.owed += 1;
        }
        self.maybe_flush()
    }

    pub(crate) fn delete(&mut self, key: &[u8]) -> Result<(), ClusterError> {
        encode_delete(&mut self.out, key);
        self.owed += 1;
        self.maybe_flush()
    }

    /// The connection itself, once nothing is queued or owed (a copy stream's, after its
    /// `cluster import` was answered).
    pub(crate) fn into_stream(self) -> TcpStream {
        debug_assert!(self.out.is_empty() && self.owed == 0);
        self.stream
    }

    pub(crate) fn line(&mut self, line: &[u8]) -> Result<(), ClusterError> {
        self.out.extend_from_slice(line);
        self.owed += 1;
        self.maybe_flush()
    }

    /// A full batch is written (its replies read later); past [`OWED_MAX`] replies owed,
    /// they are read.
    fn maybe_flush(&mut self) -> Result<(), ClusterError> {
        if self.owed >= OWED_MAX {
            self.refused += self.flush()?;
        } else if self.out.len() >= BATCH {
            self.send()?;
        }
        Ok(())
    }

    /// Writes what is queued, its replies read later ([`Pipe::flush`]).
    pub(crate) fn send(&mut self) -> Result<(), ClusterError> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).map_err(stream_error)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Writes what is queued and reads every reply owed; returns how many were refusals
    /// (those read since the last call too).
    pub(crate) fn flush(&mut self) -> Result<u64, ClusterError> {
        let err = stream_error;
        self.send()?;
        let mut refused = std::mem::take(&mut self.refused);
        let mut chunk = [0u8; 64 * 1024];
        while self.owed > 0 {
            while let Some(nl) = memchr_nl(&self.inb) {
                let line = &self.inb[..nl];
                if is_refusal(line) {
                    refused += 1;
                    tracing::warn!("migration: {}", String::from_utf8_lossy(line).trim_end());
                }
                self.inb.drain(..=nl);
                self.owed -= 1;
                if self.owed == 0 {
                    break;
                }
            }
            if self.owed == 0 {
                break;
            }
            let n = match self.stream.read(&mut chunk) {
                // A stop and continue of this process (SIGSTOP, SIGCONT) interrupts a read.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => r.map_err(err)?,
            };
            if n == 0 {
                return Err(ClusterError::Migration(
                    "new owner closed the stream".into(),
                ));
            }
            self.inb.extend_from_slice(&chunk[..n]);
        }
        Ok(refused)
    }
}

/// A stream's I/O error as the migration reports it.
fn stream_error(e: std::io::Error) -> ClusterError {
    ClusterError::Migration(match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            "no reply in time (the node is paused, overloaded or cut off)".into()
        }
        _ => format!("stream: {e}"),
    })
}

/// Appends storage command `command` (with its space) for an item to `out`: false, and
/// nothing appended, if the item expired meanwhile.
pub(crate) fn encode_store(
    out: &mut Vec<u8>,
    command: &[u8],
    key: &[u8],
    flags: u32,
    exptime: u64,
    value: &[u8],
) -> bool {
    if exptime != 0 && exptime <= now_unix() {
        return false;
    }
    // An absolute unix time (> 30 days) is read as such by the receiving node.
    out.extend_from_slice(command);
    out.extend_from_slice(key);
    let mut head = [0u8; 64];
    let mut w = &mut head[..];
    let _ = write!(w, " {flags} {exptime} {}\r\n", value.len());
    let n = 64 - w.len();
    out.extend_from_slice(&head[..n]);
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    true
}

/// Appends `delete KEY` to `out`.
pub(crate) fn encode_delete(out: &mut Vec<u8>, key: &[u8]) {
    out.extend_from_slice(b"delete ");
    out.extend_from_slice(key);
    out.extend_from_slice(b"\r\n");
}

/// Whether a reply line is a refusal.
pub(crate) fn is_refusal(line: &[u8]) -> bool {
    line.starts_with(b"SERVER_ERROR")
        || line.starts_with(b"CLIENT_ERROR")
        || line.starts_with(b"ERROR")
}

pub(crate) fn memchr_nl(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}
