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
}

impl Client {
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

    fn send(&mut self) -> Result<(), ConnError> {
        self.stream.write_all(&self.out)?;
        Ok(())
    }

    /// Reads until one frame is complete and maps it with `f` (an `Err` is an unexpected reply).
    fn next<R>(&mut self, f: impl Fn(Reply<'_>) -> Result<R, String>) -> Result<R, ConnError> {
        loop {
            if let ParsedReply::Complete { reply, len } = proto::parse_reply(&self.inb)? {
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
