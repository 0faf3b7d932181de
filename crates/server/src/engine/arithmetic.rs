//! The arithmetic family: `incr`, `decr`.

use kvlab_protocol::response as r;
use kvlab_store::{ArithRequest, ArithStatus};

use super::{ClassOp, Done, Engine};
use crate::slabs::ClassCounters;

/// `incr_hits` or `decr_hits` in the class of the item found (`class`, 0 for none: an
/// item made by `ma N` is no hit), or `outofmemory` there.
pub(super) fn count_arith(classes: &ClassCounters, status: ArithStatus, incr: bool, class: u32) {
    match status {
        ArithStatus::Ok { .. } if incr => classes.add(ClassOp::IncrHit, class),
        ArithStatus::Ok { .. } => classes.add(ClassOp::DecrHit, class),
        ArithStatus::OutOfMemory => classes.add(ClassOp::OutOfMemory, class),
        _ => {}
    }
}

impl Engine {
    /// `incr` (`incr`) or `decr` of `key` by `delta`.
    #[inline]
    pub(super) fn arith(
        &mut self,
        incr: bool,
        key: &[u8],
        delta: u64,
        noreply: bool,
        out: &mut Vec<u8>,
    ) -> Done {
        let req = ArithRequest {
            incr,
            delta,
            compare_cas: None,
            new_cas: None,
            vivify: None,
            touch: None,
        };
        let class = self.class_now(key);
        let status = self.store.arith(key, &req);
        count_arith(&self.worker.classes, status, incr, class);
        match status {
            ArithStatus::Ok { value, .. } => {
                if !noreply {
                    r::number(out, value);
                }
                return Done::Changed;
            }
            // As memcached: `noreply` silences the errors too (a client that
            // asked for no reply would read one as the reply to its next call).
            _ if noreply => {}
            ArithStatus::NotFound | ArithStatus::Exists => out.extend_from_slice(r::NOT_FOUND),
            ArithStatus::NonNumeric => out.extend_from_slice(r::NON_NUMERIC),
            ArithStatus::OutOfMemory => out.extend_from_slice(r::ARITH_OUT_OF_MEMORY),
        }
        Done::Unchanged
    }
}
