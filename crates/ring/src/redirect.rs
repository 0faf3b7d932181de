//! A kvlab cluster node's redirect replies (see the crate's root): what a node writes, what
//! the connections that recognise them and the cluster-aware clients that follow them read.

/// A node's answer to a key it cannot serve now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// `SERVER_ERROR MOVED <epoch> <node>`: `node` owns the key under ring `epoch`.
    Moved {
        /// The epoch of the node's ring.
        epoch: u64,
        /// The owner under it.
        node: String,
    },
    /// `SERVER_ERROR TRYAGAIN <epoch>`: the node owns the key under ring `epoch`, and its
    /// data is still arriving: try again shortly.
    TryAgain {
        /// The epoch of the node's ring.
        epoch: u64,
    },
}

impl Redirect {
    /// Reads the text after `SERVER_ERROR ` (`None`: another server error).
    pub fn parse(reason: &[u8]) -> Option<Redirect> {
        let text = std::str::from_utf8(reason).ok()?;
        let mut w = text.split_ascii_whitespace();
        match (w.next()?, w.next()?.parse().ok()?) {
            ("MOVED", epoch) => Some(Redirect::Moved {
                epoch,
                node: w.next()?.to_string(),
            }),
            ("TRYAGAIN", epoch) => Some(Redirect::TryAgain { epoch }),
            _ => None,
        }
    }

    /// Appends the whole reply line.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Redirect::Moved { epoch, node } => {
                out.extend_from_slice(format!("SERVER_ERROR MOVED {epoch} {node}\r\n").as_bytes())
            }
            Redirect::TryAgain { epoch } => {
                out.extend_from_slice(format!("SERVER_ERROR TRYAGAIN {epoch}\r\n").as_bytes())
            }
        }
    }

    /// The epoch the node answered under.
    pub fn epoch(&self) -> u64 {
        match self {
            Redirect::Moved { epoch, .. } | Redirect::TryAgain { epoch } => *epoch,
        }
    }
}
