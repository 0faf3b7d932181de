//! Matching memcached text replies (`VALUE` … `END`, one-line replies) to the requests in
//! flight.

use kvlab_protocol::client::{parse_reply, ParsedReply, Reply};

use super::{redirect_epoch, unexpected, Conn, ConnError, Event, ReqKind, Status};

impl<T> Conn<T> {
    /// Parses memcached text replies.
    pub(super) fn parse_text(
        &mut self,
        f: &mut impl FnMut(Event<'_, T>),
    ) -> Result<usize, ConnError> {
        let mut done = 0;
        loop {
            let buf = &self.inb[self.in_start..self.in_end];
            let (reply, len) = match parse_reply(buf)? {
                ParsedReply::Incomplete => break,
                ParsedReply::Complete { reply, len } => (reply, len),
            };
            let Some(head) = self.pending.front() else {
                return Err(unexpected(&reply, None));
            };
            let kind = head.kind;
            let status = match (kind, &reply) {
                (
                    ReqKind::Get { .. },
                    Reply::Value {
                        key, flags, data, ..
                    },
                ) => {
                    self.head_hits += 1;
                    f(Event::Value {
                        user: &head.user,
                        key,
                        flags: *flags,
                        data,
                    });
                    self.in_start += len;
                    continue;
                }
                (_, r) if r.is_error() => {
                    self.head_redirect = redirect_epoch(r);
                    Status::Error
                }
                (ReqKind::Get { .. }, Reply::End) => Status::Ok,
                (ReqKind::Store, Reply::Stored) => Status::Ok,
                (ReqKind::Store, Reply::NotStored | Reply::Exists | Reply::NotFound) => {
                    Status::Negative
                }
                (ReqKind::Delete, Reply::Deleted) => Status::Ok,
                (ReqKind::Delete, Reply::NotFound) => Status::Negative,
                (
                    ReqKind::Line,
                    Reply::Ok
                    | Reply::Touched
                    | Reply::Number(_)
                    | Reply::Version(_)
                    | Reply::MetaHeader(_)
                    | Reply::MetaNoop
                    | Reply::Stored
                    | Reply::Deleted,
                ) => Status::Ok,
                (
                    ReqKind::Line,
                    Reply::NotFound
                    | Reply::NotStored
                    | Reply::Exists
                    | Reply::MetaMiss
                    | Reply::MetaNotFound
                    | Reply::MetaNotStored
                    | Reply::MetaExists,
                ) => Status::Negative,
                (kind, r) => return Err(unexpected(r, Some(kind))),
            };
            if !self.finish_head(kind, status, len, f) {
                break;
            }
            done += 1;
        }
        self.reset_if_drained();
        Ok(done)
    }
}
