//! Matching HTTP/1.1 responses from kvlab's REST interface to the requests in flight.

use crate::http::{self, Method, ParsedResponse};

use super::{lossy_head, Conn, ConnError, Event, Outcome, ReqKind, Status};

impl<T> Conn<T> {
    pub(super) fn parse_http(
        &mut self,
        f: &mut impl FnMut(Event<'_, T>),
    ) -> Result<usize, ConnError> {
        let mut done = 0;
        loop {
            let Some(head) = self.pending.front() else {
                if self.in_start < self.in_end {
                    return Err(ConnError::Unexpected {
                        reply: lossy_head(&self.inb[self.in_start..self.in_end]),
                        kind: None,
                    });
                }
                break;
            };
            let kind = head.kind;
            let method = match kind {
                ReqKind::Get { .. } | ReqKind::Line => Method::Get,
                ReqKind::Store => Method::Put,
                ReqKind::Delete => Method::Delete,
            };
            let buf = &self.inb[self.in_start..self.in_end];
            let (resp, len) = match http::parse_response(buf, method)? {
                ParsedResponse::Incomplete => break,
                ParsedResponse::Complete { response, len } => (response, len),
            };
            // Interim responses (100 Continue, 103 Early Hints) precede the real one.
            if (100..200).contains(&resp.status) {
                self.in_start += len;
                continue;
            }
            let code = resp.status;
            let status = match (kind, code) {
                (ReqKind::Get { keys }, 200 | 404) => {
                    if code == 200 {
                        self.head_hits += 1;
                        f(Event::Value {
                            user: &head.user,
                            key: &[],
                            flags: 0,
                            data: resp.body,
                        });
                    }
                    self.head_responses += 1;
                    self.in_start += len;
                    if self.head_responses < keys {
                        continue;
                    }
                    Status::Ok
                }
                (ReqKind::Get { keys }, _) => {
                    // An error answers one GET of the group; the group fails as a whole once
                    // all its responses are in.
                    self.head_responses += 1;
                    self.head_failed = true;
                    self.in_start += len;
                    if self.head_responses < keys {
                        continue;
                    }
                    Status::Error
                }
                (ReqKind::Store, 200 | 201 | 204) => Status::Ok,
                (ReqKind::Delete, 200 | 204) => Status::Ok,
                (ReqKind::Delete | ReqKind::Line, 404) => Status::Negative,
                (ReqKind::Line, 200..=299) => Status::Ok,
                _ => Status::Error,
            };
            if !matches!(kind, ReqKind::Get { .. }) {
                self.in_start += len;
            }
            let hits = std::mem::take(&mut self.head_hits);
            let status = if std::mem::take(&mut self.head_failed) {
                Status::Error
            } else {
                status
            };
            let responses = std::mem::take(&mut self.head_responses);
            let misses = match kind {
                ReqKind::Get { .. } => responses.saturating_sub(hits),
                _ => 0,
            };
            let misses = if status == Status::Error { 0 } else { misses };
            let redirect = self.head_redirect.take();
            if !self.complete_head(
                kind,
                Outcome {
                    status,
                    hits,
                    misses,
                    redirect,
                },
                f,
            ) {
                break;
            }
            done += 1;
        }
        self.reset_if_drained();
        Ok(done)
    }
}
