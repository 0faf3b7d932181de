//! The arithmetic family: `incr`, `decr`.

use kvlab_protocol::response as r;
use kvlab_store::{ArithRequest, ArithStatus};

use super::{Engine, Flow};

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
    ) -> Flow {
        let req = ArithRequest {
            incr,
            delta,
            compare_cas: None,
            new_cas: None,
            vivify: None,
            touch: None,
        };
        match self.store.arith(key, &req) {
            ArithStatus::Ok { value, .. } => {
                if !noreply {
                    r::number(out, value);
                }
                return self.persisted(key);
            }
            // As memcached: `noreply` silences the errors too (a client that
            // asked for no reply would read one as the reply to its next call).
            _ if noreply => {}
            ArithStatus::NotFound | ArithStatus::Exists => out.extend_from_slice(r::NOT_FOUND),
            ArithStatus::NonNumeric => out.extend_from_slice(r::NON_NUMERIC),
            ArithStatus::OutOfMemory => out.extend_from_slice(r::ARITH_OUT_OF_MEMORY),
        }
        Flow::Done
    }
}
