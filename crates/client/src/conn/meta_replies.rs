//! Matching meta replies (`VA`, `EN`, `HD`, … and the `MN` that ends a quiet multi-get) to the
//! requests in flight.

use kvlab_protocol::client::{meta_client_flags, parse_reply, ParsedReply, Reply};

use super::{redirect_epoch, unexpected, Conn, ConnError, Event, ReqKind, Status};

impl<T> Conn<T> {
    pub(super) fn parse_meta(
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
            // A multi-key get is quiet gets ended by `mn`: only `MN` ends it.
            let quiet = matches!(kind, ReqKind::Get { keys } if keys > 1);
            let status = match (kind, &reply) {
                (ReqKind::Get { .. }, Reply::MetaValue { flags, data }) => {
                    self.head_hits += 1;
                    f(Event::Value {
                        user: &head.user,
                        key: &[],
                        flags: meta_client_flags(flags),
                        data,
                    });
                    if quiet {
                        self.in_start += len;
                        continue;
                    }
                    Status::Ok
                }
                (ReqKind::Get { .. }, r) if quiet && r.is_error() => {
                    // The error answers one key; the others and `MN` still follow.
                    self.head_failed = true;
                    self.in_start += len;
                    continue;
                }
                (ReqKind::Get { .. }, Reply::MetaNoop) if quiet => Status::Ok,
                (ReqKind::Get { .. }, Reply::MetaMiss) if !quiet => Status::Ok,
                (_, r) if r.is_error() => {
                    self.head_redirect = redirect_epoch(r);
                    Status::Error
                }
                (ReqKind::Store | ReqKind::Delete | ReqKind::Line, Reply::MetaHeader(_)) => {
                    Status::Ok
                }
                (ReqKind::Line, Reply::MetaNoop) => Status::Ok,
                (
                    ReqKind::Store | ReqKind::Line,
                    Reply::MetaNotStored | Reply::MetaExists | Reply::MetaNotFound,
                ) => Status::Negative,
                (ReqKind::Delete, Reply::MetaNotFound | Reply::MetaExists) => Status::Negative,
                (ReqKind::Line, Reply::MetaMiss) => Status::Negative,
                (kind, r) => return Err(unexpected(r, Some(kind))),
            };
            let status = if std::mem::take(&mut self.head_failed) {
                Status::Error
            } else {
                status
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
