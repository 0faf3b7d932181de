//! The binary protocol's loop: each request translated to the text or meta request with
//! its meaning, served, and its reply translated back.

use std::time::Instant;

use kvlab_protocol::{binary, MetaKey, ProtocolError};

use super::{server_error, Session, OUTPUT_HIGH_WATER};
use crate::service::{Completion, Flow, Order, Service, Work};

/// Reused buffers of a binary connection: the meta flag text of a translated request,
/// and the service's text reply before it becomes a binary response.
#[derive(Default)]
pub(super) struct BinaryBuffers {
    flags: Vec<u8>,
    reply: Vec<u8>,
}

impl<S: Service> Session<S> {
    /// [`Session::run`] for a binary connection: each request is translated into the text
    /// or meta request with its meaning, served, and its text reply translated back
    /// ([`kvlab_protocol::binary`]). Deferred work runs inline, within its request (a
    /// compatibility path: a durable cache's disk read blocks the loop meanwhile).
    pub(super) fn run_binary(&mut self, service: &mut S) {
        let mut bin = self.binary.take().unwrap_or_default();
        let mut clock = Instant::now();
        while !self.closing
            && !self.held_up()
            && self.start < self.end
            && self.pending_output() < OUTPUT_HIGH_WATER
        {
            let input = &self.input[self.start..self.end];
            let header = match binary::frame(input, self.limits.item_size_max) {
                binary::Frame::Incomplete => break,
                binary::Frame::BadMagic => {
                    // memcached closes such a connection without a word.
                    self.closing = true;
                    break;
                }
                binary::Frame::TooLarge(header) => {
                    if !self.refuse_too_large(service, &header) {
                        break;
                    }
                    continue;
                }
                binary::Frame::Packet(header) => header,
            };
            let timed = self.serve_packet(service, &mut bin, &header);
            let now = Instant::now();
            if timed {
                self.samples
                    .push(now.duration_since(clock).as_nanos() as u64);
            }
            clock = now;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        self.binary = Some(bin);
        service.record_service(&self.samples);
        self.samples.clear();
    }

    /// A request whose value is over the item size limit: refused (a store with `E2BIG`,
    /// anything else with `EINVAL` and the connection closed), the key's stale value
    /// dropped as memcached does, and the body skipped. False: the key has not all
    /// arrived yet (memcached reads it before it refuses the value); nothing was done.
    fn refuse_too_large(&mut self, service: &mut S, header: &binary::Header) -> bool {
        let input = &self.input[self.start..self.end];
        let drops = header.too_large_drops();
        if drops.as_ref().is_some_and(|key| input.len() < key.end) {
            return false;
        }
        let reply = if header.stores() {
            binary::status::E2BIG
        } else {
            self.closing = true;
            binary::status::EINVAL
        };
        binary::error(&mut self.output, header, reply);
        service.protocol_error(ProtocolError::TooLarge);
        if let Some(key) = drops {
            let key = MetaKey::plain(&input[key]);
            if let Some(work) = service.drop_stale(&mut self.conn, key) {
                // Inline, as every binary request's work: the old value is gone
                // (on disk too under `sync`) before the next request is read.
                if let Completion::Reply(bytes) = work.run(service.worker()) {
                    service.recycle(bytes);
                }
            }
        }
        let body = header.body_len as usize;
        let buffered = (input.len() - binary::HEADER_LEN).min(body);
        self.start += binary::HEADER_LEN + buffered;
        self.swallow = body - buffered;
        true
    }

    /// One whole packet: translated, served (or answered directly), its reply written and
    /// its bytes consumed. Returns whether its service time counts ([`Service::timed`]).
    fn serve_packet(
        &mut self,
        service: &mut S,
        bin: &mut BinaryBuffers,
        header: &binary::Header,
    ) -> bool {
        let input = &self.input[self.start..self.end];
        let consumed = binary::HEADER_LEN + header.body_len as usize;
        let body = &input[binary::HEADER_LEN..consumed];
        let mut timed = true;
        match binary::translate(header, body, &mut bin.flags) {
            binary::Translated::Call(request) => {
                timed = service.timed(&request);
                bin.reply.clear();
                if serve_inline(service, &mut self.conn, &request, &mut bin.reply) {
                    self.closing = true;
                }
                binary::respond(
                    &mut self.output,
                    header,
                    binary::key(header, body),
                    &bin.reply,
                );
            }
            binary::Translated::Direct => {
                binary::direct(&mut self.output, header);
                if binary::closes(header) {
                    self.closing = true;
                }
            }
            binary::Translated::Unknown => {
                binary::error(&mut self.output, header, binary::status::UNKNOWN_COMMAND);
            }
            binary::Translated::Invalid => {
                service.protocol_error(ProtocolError::BadFormat);
                binary::error(&mut self.output, header, binary::status::EINVAL);
                self.closing = true;
            }
        }
        self.start += consumed;
        timed
    }
}

/// Serves a translated request with its deferred work run inline (rerun where the work
/// asks), its text reply in `reply`. True: the service closes the connection.
fn serve_inline<S: Service>(
    service: &mut S,
    conn: &mut S::Conn,
    request: &kvlab_protocol::Request<'_>,
    reply: &mut Vec<u8>,
) -> bool {
    let mut rerun = false;
    loop {
        match service.call(conn, request, reply, rerun) {
            Flow::Done => return false,
            Flow::Close | Flow::HandOff => return true,
            Flow::Defer(work, order) => match (work.run(service.worker()), order) {
                (Completion::Failed(reason), _) => {
                    reply.clear();
                    server_error(reply, &reason);
                }
                (_, Order::Rerun) => {
                    reply.clear();
                    rerun = true;
                    continue;
                }
                (Completion::Reply(bytes), _) => {
                    reply.extend_from_slice(&bytes);
                    service.recycle(bytes);
                }
                (Completion::Rerun | Completion::Release, _) => {}
            },
        }
        return false;
    }
}
