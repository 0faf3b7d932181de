//! Pending reply slots: deferred work handed to the driver, and its outcome written into the
//! held-back place of its reply.

use kvlab_protocol::{parse, Parsed};

use super::{server_error, Session, SlotId};
use crate::service::{Completion, Order, Service};

impl<S: Service> Session<S> {
    /// Takes deferred work for the driver to run (on a helper thread, or inline). Its slot
    /// stays pending until [`Session::complete`].
    pub fn take_work(&mut self) -> Option<(SlotId, S::Work)> {
        self.work.pop_front()
    }

    /// Whether some reply is pending.
    pub fn is_waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Reports the outcome of the work of slot `id`; gives back the buffer of a
    /// [`Completion::Reply`] once its bytes are taken (for [`Service::recycle`]). A slot
    /// that is no longer pending (its outcome already reported) is ignored.
    pub fn complete(&mut self, id: SlotId, done: Completion) -> Option<Vec<u8>> {
        let i = self.pending.iter().position(|p| p.id == id)?;
        let slot = self.pending.remove(i)?;
        match done {
            Completion::Failed(reason) => {
                // The failure path may allocate; the ready path never does.
                let mut msg = Vec::with_capacity(reason.len() + 15);
                server_error(&mut msg, &reason);
                self.replace(i, slot.at..slot.at + slot.len, &msg);
                if slot.order == Order::Rerun {
                    // The request can't run without what it waited for: drop it with the error.
                    if let Parsed::Request { consumed, .. } =
                        parse(&self.input[self.start..self.end], &self.limits)
                    {
                        self.start += consumed;
                    }
                }
            }
            // A request waiting to run again runs again whatever else it was told.
            _ if slot.order == Order::Rerun => self.rerun = true,
            Completion::Rerun | Completion::Release => {}
            Completion::Reply(bytes) => {
                let at = slot.at + slot.len;
                self.replace(i, at..at, &bytes);
                return Some(bytes);
            }
        }
        None
    }

    /// Replaces `range` of the output with `bytes` and moves the pending slots from index
    /// `from` on (which all lie after `range`) accordingly.
    pub(super) fn replace(&mut self, from: usize, range: std::ops::Range<usize>, bytes: &[u8]) {
        let removed = range.len();
        let (at, end, old_len) = (range.start, range.end, self.output.len());
        if at == old_len {
            // At the end (nothing composed after it yet): a plain append.
            self.output.extend_from_slice(bytes);
        } else if bytes.len() >= removed {
            // Move what follows right by the difference (one memmove), then copy in.
            let grow = bytes.len() - removed;
            self.output.resize(old_len + grow, 0);
            self.output.copy_within(end..old_len, end + grow);
            self.output[at..at + bytes.len()].copy_from_slice(bytes);
        } else {
            self.output[at..at + bytes.len()].copy_from_slice(bytes);
            self.output.copy_within(end..old_len, at + bytes.len());
            self.output.truncate(old_len - (removed - bytes.len()));
        }
        for p in self.pending.iter_mut().skip(from) {
            p.at = p.at + bytes.len() - removed;
        }
    }
}
