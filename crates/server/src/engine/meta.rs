//! The meta commands (`mn`, `mg`, `ms`, `md`, `ma`, `me`): flags in, flags echoed back.

use kvlab_protocol::response::{self as r, push_i64, push_u64};
use kvlab_protocol::{MetaCommand, MetaFlags, MetaKey};
use kvlab_store::{
    ArithRequest, ArithStatus, DeleteStatus, MetaDeleteOpts, MetaGetOpts, SetMode, SetRequest,
    SetStatus, SizeClasses,
};

use super::{ClassOp, Done, Engine, WorkerStats};

impl Engine {
    /// A meta command (`mn`, `mg`, `ms`, `md`, `ma`, `me`): whether it changed its key.
    #[inline]
    pub(super) fn meta_request(
        &mut self,
        command: MetaCommand,
        key: MetaKey<'_>,
        flags: &MetaFlags<'_>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Done {
        WorkerStats::add(&self.worker.cmd_meta, 1);
        Done::changed_if(self.meta(command, key, flags, data, out))
    }

    /// Runs a meta command; returns whether it changed the key.
    fn meta(
        &mut self,
        command: MetaCommand,
        key: MetaKey<'_>,
        flags: &MetaFlags<'_>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> bool {
        match command {
            MetaCommand::Noop => out.extend_from_slice(r::MN),
            MetaCommand::Get => return self.meta_get(key, flags, out),
            MetaCommand::Set => return self.meta_set(key, flags, data, out),
            MetaCommand::Delete => return self.meta_delete(key, flags, out),
            MetaCommand::Arith => return self.meta_arith(key, flags, out),
            MetaCommand::Debug => self.meta_debug(key, out),
        }
        false
    }

    /// Returns whether it changed the key: a new TTL (`T`) on a hit. (An item created
    /// by `N` is a placeholder, and win tokens are not kept on disk.)
    fn meta_get(&mut self, key: MetaKey<'_>, flags: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
        WorkerStats::add(&self.worker.cmd_get, 1);
        if flags.ttl.is_some() {
            WorkerStats::add(&self.worker.cmd_touch, 1);
        }
        let opts = MetaGetOpts {
            touch: flags.ttl,
            vivify: flags.vivify,
            recache: flags.recache,
            no_bump: flags.no_bump,
        };
        let hit = key.with(|k| self.store.meta_get(k, &opts));
        key.with(|k| self.log_fetch(k, hit.as_ref().map(|h| (h.item.value.len(), h.item.flags))));
        let Some(hit) = hit else {
            if !flags.quiet {
                out.extend_from_slice(b"EN");
                echo_flags(out, key, flags, 0);
                out.extend_from_slice(b"\r\n");
            }
            return false;
        };
        let op = if flags.ttl.is_some() {
            ClassOp::TouchHit
        } else {
            ClassOp::GetHit
        };
        let key_len = key.with(<[u8]>::len);
        self.count_class(op, key_len, hit.item.value.len(), hit.item.flags);
        let value = &hit.item.value;
        if flags.has(b'v') {
            out.extend_from_slice(b"VA ");
            push_u64(out, value.len() as u64);
        } else {
            out.extend_from_slice(b"HD");
        }
        for letter in flags.letters() {
            match letter {
                b'c' => meta_num(out, b'c', self.shown(hit.item.cas)),
                b'f' => meta_num(out, b'f', u64::from(hit.item.flags)),
                b'h' => meta_num(out, b'h', u64::from(hit.hit_before)),
                b'l' => meta_num(out, b'l', hit.last_access_age),
                b's' => meta_num(out, b's', value.len() as u64),
                b't' => {
                    out.extend_from_slice(b" t");
                    push_i64(out, hit.ttl);
                }
                b'k' | b'O' => echo_one(out, letter, key, flags),
                _ => {}
            }
        }
        if key.is_base64() && flags.has(b'k') {
            out.extend_from_slice(b" b");
        }
        if hit.win_already_sent {
            out.extend_from_slice(b" Z");
        }
        if hit.stale {
            out.extend_from_slice(b" X");
        }
        if hit.won {
            out.extend_from_slice(b" W");
        }
        out.extend_from_slice(b"\r\n");
        if flags.has(b'v') {
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        flags.ttl.is_some()
    }

    fn meta_set(
        &mut self,
        key: MetaKey<'_>,
        flags: &MetaFlags<'_>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> bool {
        WorkerStats::add(&self.worker.cmd_set, 1);
        let mode = match flags.mode {
            None | Some(b'S') => SetMode::Set,
            Some(b'E') => SetMode::Add,
            Some(b'A') => SetMode::Append,
            Some(b'P') => SetMode::Prepend,
            _ => SetMode::Replace,
        };
        let status = key.with(|k| {
            let old_class = flags.compare_cas.map_or(0, |_| self.class_now(k));
            let mut req = SetRequest {
                mode,
                key: k,
                value: data,
                flags: flags.client_flags.unwrap_or(0),
                exptime: flags.ttl.unwrap_or(0),
                compare_cas: flags.compare_cas.map(|c| self.compared(c)),
                new_cas: flags.new_cas,
                invalidate: flags.invalidate,
            };
            let status = self.store.set(&req);
            let cmd: &[u8] = match (mode, req.compare_cas) {
                (SetMode::Set, Some(_)) => b"cas",
                (SetMode::Set, None) => b"set",
                (SetMode::Add, _) => b"add",
                (SetMode::Replace, _) => b"replace",
                (SetMode::Append, _) => b"append",
                (SetMode::Prepend, _) => b"prepend",
            };
            self.log_store(k, status, cmd, req.exptime, data.len(), req.flags);
            self.count_store(status, k, data.len(), req.flags, old_class);
            // `N` with append/prepend: create the item when it is missing (autovivify).
            if status == SetStatus::NotStored
                && matches!(mode, SetMode::Append | SetMode::Prepend)
                && flags.vivify.is_some()
            {
                req.mode = SetMode::Add;
                req.exptime = flags.vivify.unwrap_or(0);
                return self.store.set(&req);
            }
            status
        });
        let (code, cas): (&[u8], u64) = match status {
            SetStatus::Stored { cas } => (b"HD", cas),
            SetStatus::NotStored => (b"NS", 0),
            SetStatus::Exists => (b"EX", 0),
            SetStatus::NotFound => (b"NF", 0),
            SetStatus::TooLarge => {
                out.extend_from_slice(r::TOO_LARGE);
                return false;
            }
            SetStatus::OutOfMemory => {
                out.extend_from_slice(r::OUT_OF_MEMORY);
                return false;
            }
        };
        let stored = code == b"HD";
        if !(flags.quiet && stored) {
            out.extend_from_slice(code);
            echo_flags(out, key, flags, cas);
            out.extend_from_slice(b"\r\n");
        }
        stored
    }

    fn meta_delete(&mut self, key: MetaKey<'_>, flags: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
        let opts = MetaDeleteOpts {
            compare_cas: flags.compare_cas.map(|c| self.compared(c)),
            invalidate: flags.invalidate,
            ttl: flags.ttl,
        };
        let status = key.with(|k| {
            let class = self.class_now(k);
            let status = self.store.meta_delete(k, &opts);
            // `I` marks the item stale instead of removing it: no delete hit (memcached).
            if status == DeleteStatus::Deleted && !flags.invalidate {
                self.worker.classes.add(ClassOp::DeleteHit, class);
            }
            status
        });
        let code: &[u8] = match status {
            DeleteStatus::Deleted if flags.quiet => return true,
            DeleteStatus::Deleted => b"HD",
            DeleteStatus::NotFound => b"NF",
            DeleteStatus::Exists => b"EX",
        };
        out.extend_from_slice(code);
        echo_flags(out, key, flags, 0);
        out.extend_from_slice(b"\r\n");
        code == b"HD"
    }

    fn meta_arith(&mut self, key: MetaKey<'_>, flags: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
        let req = ArithRequest {
            incr: !matches!(flags.mode, Some(b'D' | b'-')),
            delta: flags.delta.unwrap_or(1),
            compare_cas: flags.compare_cas.map(|c| self.compared(c)),
            new_cas: flags.new_cas,
            vivify: flags.vivify.map(|ttl| (flags.initial.unwrap_or(0), ttl)),
            touch: flags.ttl,
        };
        let status = key.with(|k| {
            let class = self.class_now(k);
            let status = self.store.arith(k, &req);
            super::arithmetic::count_arith(&self.worker.classes, status, req.incr, class);
            status
        });
        let (value, cas, ttl) = match status {
            ArithStatus::Ok { value, cas, ttl } => (value, cas, ttl),
            status @ (ArithStatus::NotFound | ArithStatus::Exists) => {
                let code: &[u8] = if status == ArithStatus::Exists {
                    b"EX"
                } else {
                    b"NF"
                };
                out.extend_from_slice(code);
                echo_flags(out, key, flags, 0);
                out.extend_from_slice(b"\r\n");
                return false;
            }
            ArithStatus::NonNumeric => {
                out.extend_from_slice(r::NON_NUMERIC);
                return false;
            }
            ArithStatus::OutOfMemory => {
                out.extend_from_slice(r::ARITH_OUT_OF_MEMORY);
                return false;
            }
        };
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(value).as_bytes();
        if flags.has(b'v') {
            out.extend_from_slice(b"VA ");
            push_u64(out, digits.len() as u64);
        } else if flags.quiet {
            return true;
        } else {
            out.extend_from_slice(b"HD");
        }
        for letter in flags.letters() {
            match letter {
                b'c' => meta_num(out, b'c', self.shown(cas)),
                b't' => {
                    out.extend_from_slice(b" t");
                    push_i64(out, ttl);
                }
                b'k' | b'O' => echo_one(out, letter, key, flags),
                _ => {}
            }
        }
        out.extend_from_slice(b"\r\n");
        if flags.has(b'v') {
            out.extend_from_slice(digits);
            out.extend_from_slice(b"\r\n");
        }
        true
    }

    /// `me`: memcached's debug line, `ME <key> exp= la= cas= fetch= cls= size=`: `exp` the
    /// seconds left (-1: none; memcached 1.6.18 prints their negation, later releases
    /// the seconds left), `size` memcached's whole item (`ITEM_ntotal`: header, key,
    /// suffix, value) and `cls` its class.
    fn meta_debug(&mut self, key: MetaKey<'_>, out: &mut Vec<u8>) {
        let Some(hit) = key.with(|k| self.store.peek(k)) else {
            return out.extend_from_slice(b"EN\r\n");
        };
        out.extend_from_slice(b"ME ");
        out.extend_from_slice(key.raw());
        out.extend_from_slice(b" exp=");
        push_i64(out, hit.ttl);
        out.extend_from_slice(b" la=");
        push_u64(out, hit.last_access_age);
        out.extend_from_slice(b" cas=");
        push_u64(out, hit.item.cas);
        out.extend_from_slice(if hit.hit_before {
            b" fetch=yes"
        } else {
            b" fetch=no"
        });
        // memcached's ITEM_ntotal: header, key, suffix and value, and its class.
        let size =
            SizeClasses::item_size(key.with(<[u8]>::len), hit.item.value.len(), hit.item.flags);
        out.extend_from_slice(b" cls=");
        push_u64(out, u64::from(self.server.admin.classes.class_of(size)));
        out.extend_from_slice(b" size=");
        push_u64(out, size as u64);
        out.extend_from_slice(b"\r\n");
    }
}

fn meta_num(out: &mut Vec<u8>, letter: u8, n: u64) {
    out.push(b' ');
    out.push(letter);
    push_u64(out, n);
}

/// Echoes `k` (key) or `O` (opaque) as memcached does.
fn echo_one(out: &mut Vec<u8>, letter: u8, key: MetaKey<'_>, flags: &MetaFlags<'_>) {
    match letter {
        b'k' => {
            out.extend_from_slice(b" k");
            out.extend_from_slice(key.raw());
        }
        b'O' => {
            out.extend_from_slice(b" O");
            out.extend_from_slice(flags.opaque.unwrap_or_default());
        }
        _ => {}
    }
}

/// The flags every meta reply echoes in request order: `O`, `k` (then `b` for a base64
/// key), and `c` with the item's CAS where the reply has one.
fn echo_flags(out: &mut Vec<u8>, key: MetaKey<'_>, flags: &MetaFlags<'_>, cas: u64) {
    for letter in flags.letters() {
        match letter {
            b'k' | b'O' => echo_one(out, letter, key, flags),
            b'c' if cas != 0 => meta_num(out, b'c', cas),
            _ => {}
        }
    }
    if key.is_base64() && flags.has(b'k') {
        out.extend_from_slice(b" b");
    }
}
