//! A small blocking memcached client: one request at a time, for tools, set-up steps and
//! tests. The load generator uses [`crate::conn`] instead.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kvlab_protocol::client::{self as proto, ParsedReply, Reply};

use crate::conn::ConnError;

/// A blocking connection.
pub struct Client {
    stream: TcpStream,
    out: Vec<u8>,
    inb: Vec<u8>,
    /// The last reply line that was not a value (without `\r\n`).
    last_line: Vec<u8>,
}

/// What [`Client::call`] read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A retrieval's values (key, flags, data), ended by `END`.
    Values(Vec<(Vec<u8>, u32, Vec<u8>)>),
    /// Any other reply: its line, without `\r\n`.
    Line(Vec<u8>),
}

enum Step {
    Value(Vec<u8>, u32, Vec<u8>),
    End,
    Line,
}

impl Client {
    /// Drops the connection with a reset (`SO_LINGER` 0): whatever it sent that the
    /// server has not read yet — a request held up by a partition, say — is discarded
    /// rather than delivered later, after requests sent since on other connections.
    pub fn abort(self) {
        use std::os::fd::AsRawFd;
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt on a socket this client owns, with a valid `linger` of the
        // size given.
        unsafe {
            libc::setsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                std::ptr::addr_of!(linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
    }

    /// Connects with a timeout that applies to the connect and to every read and write.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Client {
            stream,
            out: Vec::new(),
            inb: Vec::new(),
            last_line: Vec::new(),
        })
    }

    /// `get key`: the value, or `None` on a miss.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ConnError> {
        self.out.clear();
        proto::get(&mut self.out, key).map_err(compose_err)?;
        self.send()?;
        let mut value = None;
        loop {
            let (found, done) = self.next(|r| match r {
                Reply::Value { data, .. } => Ok((Some(data.to_vec()), false)),
                Reply::End => Ok((None, true)),
                r => Err(format!("{r:?}")),
            })?;
            if found.is_some() {
                value = found;
            }
            if done {
                return Ok(value);
            }
        }
    }

    /// `set key 0 0 <len>`: true when stored.
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<bool, ConnError> {
        self.out.clear();
        proto::store(&mut self.out, proto::StoreCmd::Set, key, 0, 0, value, false)
            .map_err(compose_err)?;
        self.send()?;
        self.next(|r| match r {
            Reply::Stored => Ok(true),
            Reply::NotStored => Ok(false),
            r => Err(format!("{r:?}")),
        })
    }

    /// `delete key`: true when something was deleted.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, ConnError> {
        self.out.clear();
        proto::delete(&mut self.out, key, false).map_err(compose_err)?;
        self.send()?;
        self.next(|r| match r {
            Reply::Deleted => Ok(true),
            Reply::NotFound => Ok(false),
            r => Err(format!("{r:?}")),
        })
    }

    /// `version`: the server's version string.
    pub fn version(&mut self) -> Result<String, ConnError> {
        self.out.clear();
        proto::version(&mut self.out);
        self.send()?;
        self.next(|r| match r {
            Reply::Version(v) => Ok(String::from_utf8_lossy(v).into_owned()),
            r => Err(format!("{r:?}")),
        })
    }

    /// Sends one request (whole, with its data) and reads its answer: the values of a
    /// retrieval up to `END`, or the one line that answers anything else (`STORED`,
    /// `SERVER_ERROR …`, a meta reply's line). For replies without a value block only.
    pub fn call(&mut self, req: &[u8]) -> Result<Answer, ConnError> {
        self.stream.write_all(req)?;
        let mut values = Vec::new();
        loop {
            let step = self.next(|r| {
                Ok(match r {
                    Reply::Value {
                        key, flags, data, ..
                    } => Step::Value(key.to_vec(), flags, data.to_vec()),
                    Reply::End => Step::End,
                    _ => Step::Line,
                })
            })?;
            match step {
                Step::Value(k, f, d) => values.push((k, f, d)),
                Step::End => return Ok(Answer::Values(values)),
                Step::Line => {
                    let line = self.last_line.clone();
                    return Ok(Answer::Line(line));
                }
            }
        }
    }

    fn send(&mut self) -> Result<(), ConnError> {
        self.stream.write_all(&self.out)?;
        Ok(())
    }

    /// Reads until one frame is complete and maps it with `f` (an `Err` is an unexpected reply).
    fn next<R>(&mut self, f: impl Fn(Reply<'_>) -> Result<R, String>) -> Result<R, ConnError> {
        loop {
            if let ParsedReply::Complete { reply, len } = proto::parse_reply(&self.inb)? {
                if !matches!(reply, Reply::Value { .. }) {
                    let end = self.inb[..len].len().saturating_sub(2);
                    self.last_line.clear();
                    self.last_line.extend_from_slice(&self.inb[..end]);
                }
                let r = f(reply).map_err(|reply| ConnError::Unexpected { reply, kind: None });
                self.inb.drain(..len);
                return r;
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(ConnError::Closed);
            }
            self.inb.extend_from_slice(&chunk[..n]);
        }
    }
}

fn compose_err(e: proto::ComposeError) -> ConnError {
    ConnError::Io(io::Error::new(io::ErrorKind::InvalidInput, e))
}
