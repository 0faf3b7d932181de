//! The nemesis's schedule: from a seed, a list of timed faults over a run of D seconds —
//! the same list for the same seed, mix and duration, on any machine (ChaCha8).
//!
//! A fault names its target only by a number (`pick`): the runner chooses the target when
//! the fault comes due, among the nodes that fit then (the ring changes as the run goes),
//! as `pick % candidates`. So a seed replays the same decisions, while what they hit
//! depends on the state the cluster is in — as in any run against a live system.
//!
//! Which kinds a schedule may draw is its [`Mix`]. A cluster with one copy of every key
//! of memory-only nodes cannot survive `kill -9` of a node (its keys are gone), so its
//! default mix pauses, adds, removes and kills coordinators; with two copies it also kills
//! one node at a time and restarts it — and so it does with one copy of durable nodes
//! (`--durability sync`) whose topology is a file: a restarted node serves its keys from
//! its disk. (On etcd a dead node's lease lapses and it is taken out of the ring, its keys
//! with it when it holds their only copy.) Faults that need the topology in etcd (killing an etcd member) or nodes in
//! network namespaces (partitions, delays) are drawn only where the run has them.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// `kill -9` a node, restart it after a while.
    Kill,
    /// SIGSTOP a node for 0.1–5 s, then SIGCONT.
    Pause,
    /// Start a node and add it to the ring.
    Add,
    /// Remove a node from the ring, then stop it.
    Remove,
    /// Add two nodes at once (two coordinators racing).
    AddTwo,
    /// Remove two nodes at once (two coordinators racing).
    RemoveTwo,
    /// Kill the coordinator (`kvlab cluster add`/`remove`) mid-migration, then resume or
    /// abort the migration with another.
    CoordinatorKill,
    /// `kill -9` an etcd member, restart it after a while (topology in etcd).
    EtcdKill,
    /// `flush_all` on one node: it loses every item while it keeps running. No cluster can
    /// hide this: it is there to show that the checker sees losses.
    Flush,
    /// Cut a node off the network (all of it, or one peer) for a while (network namespaces).
    Partition,
    /// Delay a node's packets for a while (network namespaces).
    Delay,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 11] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Add,
        FaultKind::Remove,
        FaultKind::AddTwo,
        FaultKind::RemoveTwo,
        FaultKind::CoordinatorKill,
        FaultKind::EtcdKill,
        FaultKind::Flush,
        FaultKind::Partition,
        FaultKind::Delay,
    ];

    /// Its name on the command line and in records.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Add => "add",
            FaultKind::Remove => "remove",
            FaultKind::AddTwo => "add-two",
            FaultKind::RemoveTwo => "remove-two",
            FaultKind::CoordinatorKill => "coordinator-kill",
            FaultKind::EtcdKill => "etcd-kill",
            FaultKind::Flush => "flush",
            FaultKind::Partition => "partition",
            FaultKind::Delay => "delay",
        }
    }

    /// Reads [`FaultKind::name`].
    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether it changes the ring (runs on the membership lane: one migration at a time);
    /// the others act on processes and links (the fault lane).
    pub fn membership(self) -> bool {
        matches!(
            self,
            FaultKind::Add
                | FaultKind::Remove
                | FaultKind::AddTwo
                | FaultKind::RemoveTwo
                | FaultKind::CoordinatorKill
        )
    }

    /// Whether it needs the topology in etcd.
    pub fn needs_etcd(self) -> bool {
        self == FaultKind::EtcdKill
    }

    /// Whether it needs the nodes in network namespaces.
    pub fn needs_netns(self) -> bool {
        matches!(self, FaultKind::Partition | FaultKind::Delay)
    }

    /// Whether it changes a cluster's membership (a plain pool has none).
    pub fn needs_cluster(self) -> bool {
        matches!(
            self,
            FaultKind::Add
                | FaultKind::Remove
                | FaultKind::AddTwo
                | FaultKind::RemoveTwo
                | FaultKind::CoordinatorKill
                | FaultKind::EtcdKill
        )
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One fault with its drawn parameters (times in ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Fault {
    /// `kill -9` node `pick`, restart it `down_ms` later.
    Kill {
        /// Chooses the node.
        pick: u32,
        /// How long it stays dead.
        down_ms: u32,
    },
    /// SIGSTOP node `pick` for `pause_ms`.
    Pause {
        /// Chooses the node.
        pick: u32,
        /// How long it stays stopped.
        pause_ms: u32,
    },
    /// Add a new node.
    Add,
    /// Remove node `pick`.
    Remove {
        /// Chooses the node.
        pick: u32,
    },
    /// Add two new nodes at once.
    AddTwo,
    /// Remove nodes `pick` and the next one at once.
    RemoveTwo {
        /// Chooses the first node.
        pick: u32,
    },
    /// Start adding a node (`add`) or removing node `pick`, kill that coordinator
    /// `after_ms` after its migration shows in the topology, then `abort` (if still
    /// copying) or resume the migration.
    CoordinatorKill {
        /// Add a node (else remove one).
        add: bool,
        /// Chooses the node to remove.
        pick: u32,
        /// How long after the migration began the coordinator dies.
        after_ms: u32,
        /// Roll the migration back rather than resume it.
        abort: bool,
    },
    /// `kill -9` etcd member `pick`, restart it `down_ms` later.
    EtcdKill {
        /// Chooses the member.
        pick: u32,
        /// How long it stays dead.
        down_ms: u32,
    },
    /// `flush_all` on node `pick`.
    Flush {
        /// Chooses the node.
        pick: u32,
    },
    /// Cut node `pick` off (from everything, or from the node `peer` chooses) for
    /// `heal_ms`.
    Partition {
        /// Chooses the node.
        pick: u32,
        /// Chooses the one peer it is cut off from (`None`: all of the network).
        peer: Option<u32>,
        /// How long until it is healed.
        heal_ms: u32,
    },
    /// Delay node `pick`'s packets by `delay_ms` for `heal_ms`.
    Delay {
        /// Chooses the node.
        pick: u32,
        /// Added to every packet it sends.
        delay_ms: u32,
        /// How long until it is healed.
        heal_ms: u32,
    },
}

impl Fault {
    /// Its kind.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::Kill { .. } => FaultKind::Kill,
            Fault::Pause { .. } => FaultKind::Pause,
            Fault::Add => FaultKind::Add,
            Fault::Remove { .. } => FaultKind::Remove,
            Fault::AddTwo => FaultKind::AddTwo,
            Fault::RemoveTwo { .. } => FaultKind::RemoveTwo,
            Fault::CoordinatorKill { .. } => FaultKind::CoordinatorKill,
            Fault::EtcdKill { .. } => FaultKind::EtcdKill,
            Fault::Flush { .. } => FaultKind::Flush,
            Fault::Partition { .. } => FaultKind::Partition,
            Fault::Delay { .. } => FaultKind::Delay,
        }
    }
}

/// A fault and when it is due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Milliseconds after the run's start.
    pub at_ms: u64,
    /// What happens then.
    pub fault: Fault,
}

/// The kinds a schedule may draw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mix {
    kinds: Vec<FaultKind>,
}

/// What a run can offer the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Copies of every key.
    pub replicas: u32,
    /// The topology is in etcd.
    pub etcd: bool,
    /// The nodes run in network namespaces.
    pub netns: bool,
    /// A plain pool behind the proxy, not a cluster: no membership changes, and no
    /// `kill -9` (a plain server restarts empty, and nothing gives it back its keys).
    pub pool: bool,
    /// Durable nodes under `--durability sync`: a node killed and restarted while the
    /// ring names it serves every acknowledged write from its disk.
    pub durable: bool,
}

impl Capabilities {
    /// Whether the cluster is expected to survive `kill -9` and restart of one node at a
    /// time: with two copies or more (a restarted node catches up from the holders), or
    /// with durable nodes whose topology is a file (one copy: the restarted node serves
    /// its own disk; on etcd the dead node's lease lapses and the ring drops it and its
    /// keys).
    pub fn survives_kill(&self) -> bool {
        !self.pool && (self.replicas >= 2 || (self.durable && !self.etcd))
    }
}

impl Mix {
    /// The kinds a cluster with these capabilities is expected to survive: pause, add,
    /// remove (one and two at once), coordinator kill; `kill -9` where
    /// [`Capabilities::survives_kill`]; with etcd also etcd member kills; with namespaces
    /// partitions and delays.
    /// A plain pool: pauses, and with namespaces partitions and delays.
    pub fn default_for(c: Capabilities) -> Mix {
        let kinds = FaultKind::ALL
            .into_iter()
            .filter(|k| *k != FaultKind::Flush)
            .filter(|k| *k != FaultKind::Kill || c.survives_kill())
            .filter(|k| !k.needs_etcd() || c.etcd)
            .filter(|k| !k.needs_netns() || c.netns)
            .filter(|k| !k.needs_cluster() || !c.pool)
            .collect();
        Mix { kinds }
    }

    /// A comma-separated list of kinds (`pause,add,remove`), checked against what the run
    /// can do. Kinds a cluster is not expected to survive (`kill` with one copy, `flush`)
    /// may be asked for: that is how one shows the checker sees a loss.
    pub fn parse(list: &str, c: Capabilities) -> Result<Mix, String> {
        let mut kinds = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let k = FaultKind::parse(name).ok_or_else(|| {
                let all: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown fault {name:?} (one of {})", all.join(", "))
            })?;
            if k.needs_etcd() && !c.etcd {
                return Err(format!("{k} needs the topology in etcd (--topology etcd)"));
            }
            if k.needs_cluster() && c.pool {
                return Err(format!(
                    "{k} needs a cluster (a plain pool has no membership)"
                ));
            }
            if k.needs_netns() && !c.netns {
                return Err(format!(
                    "{k} needs the nodes in network namespaces (--netns, as root)"
                ));
            }
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        if kinds.is_empty() {
            return Err("no fault kinds given".into());
        }
        Ok(Mix { kinds })
    }

    /// The kinds.
    pub fn kinds(&self) -> &[FaultKind] {
        &self.kinds
    }
}

/// The ring's size as a schedule plans it: membership faults are drawn so that the ring
/// stays within `min..=max` nodes — a removal that would leave fewer than `min` becomes the
/// matching addition (when the mix has it), and the other way round. The plan is
/// approximate (a fault may fail or be skipped when it comes due); the nemesis checks the
/// bounds again then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingBounds {
    /// Nodes at the start.
    pub start: usize,
    /// Fewest nodes in the ring.
    pub min: usize,
    /// Most nodes in the ring.
    pub max: usize,
}

impl RingBounds {
    /// For a ring of `start` nodes with `replicas` copies of every key: at least
    /// `replicas + 1` nodes (and 2), at most 3 more than at the start.
    pub fn new(start: usize, replicas: u32) -> RingBounds {
        RingBounds {
            start,
            min: (replicas as usize + 1).max(2),
            max: start + 3,
        }
    }

    /// `kind`, or its counterpart when `kind` would take a ring of `size` out of bounds.
    fn balance(&self, kind: FaultKind, size: usize, mix: &Mix) -> FaultKind {
        let other = match kind {
            FaultKind::Remove if size < self.min + 1 => FaultKind::Add,
            FaultKind::RemoveTwo if size < self.min + 2 => FaultKind::AddTwo,
            FaultKind::Add if size + 1 > self.max => FaultKind::Remove,
            FaultKind::AddTwo if size + 2 > self.max => FaultKind::RemoveTwo,
            k => return k,
        };
        if mix.kinds.contains(&other) {
            other
        } else {
            kind
        }
    }
}

/// A run's faults, in time order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The run's length.
    pub duration_ms: u64,
    /// The faults.
    pub events: Vec<Event>,
}

/// First fault no earlier than this (the clients warm up).
const FIRST_MS: (u64, u64) = (500, 1500);
/// Between one fault's due time and the next.
const GAP_MS: (u64, u64) = (500, 3000);
/// No fault is due in the run's last half second.
const QUIET_END_MS: u64 = 500;

impl Schedule {
    /// Draws the schedule of `seed` for a run of `duration` with faults of `mix`, keeping
    /// the ring within `ring`.
    pub fn generate(seed: u64, duration: Duration, mix: &Mix, ring: RingBounds) -> Schedule {
        let duration_ms = duration.as_millis() as u64;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut events = Vec::new();
        let mut at = rng.gen_range(FIRST_MS.0..=FIRST_MS.1);
        let mut size = ring.start;
        while !mix.kinds.is_empty() && at + QUIET_END_MS <= duration_ms {
            let drawn = mix.kinds[rng.gen_range(0..mix.kinds.len())];
            let kind = ring.balance(drawn, size, mix);
            let pick = rng.gen::<u32>();
            let fault = match kind {
                FaultKind::Kill => Fault::Kill {
                    pick,
                    // Some restarts come before the cluster notices the death (an etcd
                    // lease lapses after 3 s), some after it.
                    down_ms: rng.gen_range(500..=8000),
                },
                FaultKind::Pause => Fault::Pause {
                    pick,
                    pause_ms: rng.gen_range(100..=5000),
                },
                FaultKind::Add => Fault::Add,
                FaultKind::Remove => Fault::Remove { pick },
                FaultKind::AddTwo => Fault::AddTwo,
                FaultKind::RemoveTwo => Fault::RemoveTwo { pick },
                FaultKind::CoordinatorKill => {
                    let add = rng.gen_bool(0.5);
                    Fault::CoordinatorKill {
                        add: (add || size < ring.min + 1) && size < ring.max,
                        pick,
                        after_ms: rng.gen_range(0..=500),
                        abort: rng.gen_bool(0.5),
                    }
                }
                FaultKind::EtcdKill => Fault::EtcdKill {
                    pick,
                    down_ms: rng.gen_range(500..=5000),
                },
                FaultKind::Flush => Fault::Flush { pick },
                FaultKind::Partition => Fault::Partition {
                    pick,
                    peer: rng.gen_bool(0.5).then(|| rng.gen()),
                    heal_ms: rng.gen_range(500..=5000),
                },
                FaultKind::Delay => Fault::Delay {
                    pick,
                    delay_ms: rng.gen_range(5..=200),
                    heal_ms: rng.gen_range(500..=5000),
                },
            };
            size = match fault {
                Fault::Add => size + 1,
                Fault::AddTwo => size + 2,
                Fault::Remove { .. } => size.saturating_sub(1),
                Fault::RemoveTwo { .. } => size.saturating_sub(2),
                // An abort leaves the ring as it was; a resume completes the change.
                Fault::CoordinatorKill {
                    add, abort: false, ..
                } if add => size + 1,
                Fault::CoordinatorKill { abort: false, .. } => size.saturating_sub(1),
                _ => size,
            };
            events.push(Event { at_ms: at, fault });
            at += rng.gen_range(GAP_MS.0..=GAP_MS.1);
        }
        Schedule {
            seed,
            duration_ms,
            events,
        }
    }

    /// How many faults of each kind it holds.
    pub fn mix(&self) -> BTreeMap<FaultKind, usize> {
        let mut m = BTreeMap::new();
        for e in &self.events {
            *m.entry(e.fault.kind()).or_insert(0) += 1;
        }
        m
    }

    /// [`Schedule::mix`] in words: `pause=3 add=1 remove=2`.
    pub fn mix_text(&self) -> String {
        let m = self.mix();
        if m.is_empty() {
            return "none".into();
        }
        m.iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING: RingBounds = RingBounds {
        start: 3,
        min: 2,
        max: 6,
    };

    const ONE_COPY: Capabilities = Capabilities {
        replicas: 1,
        etcd: false,
        netns: false,
        pool: false,
        durable: false,
    };

    #[test]
    fn a_seed_gives_the_same_schedule_and_another_seed_another() {
        let mix = Mix::default_for(ONE_COPY);
        let d = Duration::from_secs(30);
        let a = Schedule::generate(7, d, &mix, RING);
        assert_eq!(a, Schedule::generate(7, d, &mix, RING));
        assert_ne!(a, Schedule::generate(8, d, &mix, RING));
        assert!(a.events.len() >= 8, "{}", a.events.len());
        // Stable across builds and machines (ChaCha8, not the platform's generator): the
        // first fault of seed 7 is fixed.
        assert_eq!(
            a.events[0],
            Event {
                at_ms: 657,
                fault: Fault::Add
            }
        );
    }

    #[test]
    fn faults_are_in_order_within_the_run_and_of_the_mix() {
        let mix = Mix::parse("pause,kill", ONE_COPY).unwrap();
        for seed in 0..50 {
            let s = Schedule::generate(seed, Duration::from_secs(20), &mix, RING);
            let mut last = 0;
            for e in &s.events {
                assert!(e.at_ms >= last && e.at_ms + QUIET_END_MS <= 20_000, "{e:?}");
                last = e.at_ms;
                match e.fault {
                    Fault::Pause { pause_ms, .. } => assert!((100..=5000).contains(&pause_ms)),
                    Fault::Kill { down_ms, .. } => assert!((500..=8000).contains(&down_ms)),
                    ref f => panic!("{f:?} is not in the mix"),
                }
            }
        }
        let s = Schedule::generate(1, Duration::from_secs(60), &mix, RING);
        assert_eq!(s.mix().len(), 2, "{}", s.mix_text());
    }

    #[test]
    fn membership_faults_keep_the_ring_within_its_bounds() {
        let mix = Mix::default_for(ONE_COPY);
        for seed in 0..200 {
            let s = Schedule::generate(seed, Duration::from_secs(60), &mix, RING);
            let mut size = RING.start;
            for e in &s.events {
                size = match e.fault {
                    Fault::Add => size + 1,
                    Fault::AddTwo => size + 2,
                    Fault::Remove { .. } => size - 1,
                    Fault::RemoveTwo { .. } => size - 2,
                    Fault::CoordinatorKill {
                        add: true,
                        abort: false,
                        ..
                    } => size + 1,
                    Fault::CoordinatorKill {
                        add: false,
                        abort: false,
                        ..
                    } => size - 1,
                    _ => size,
                };
                assert!((RING.min..=RING.max).contains(&size), "seed {seed}: {e:?}");
            }
        }
        // A mix of removals alone cannot be balanced: they stay (and are skipped when due).
        let only = Mix::parse("remove", ONE_COPY).unwrap();
        let s = Schedule::generate(1, Duration::from_secs(30), &only, RING);
        assert!(s.events.iter().all(|e| e.fault.kind() == FaultKind::Remove));
    }

    #[test]
    fn the_default_mix_follows_what_the_cluster_can_survive() {
        let one = Mix::default_for(ONE_COPY);
        assert!(!one.kinds().contains(&FaultKind::Kill));
        assert!(one.kinds().contains(&FaultKind::Pause));
        assert!(one.kinds().contains(&FaultKind::CoordinatorKill));
        assert!(!one.kinds().contains(&FaultKind::Flush));
        assert!(!one.kinds().contains(&FaultKind::EtcdKill));
        assert!(!one.kinds().contains(&FaultKind::Partition));
        let two = Mix::default_for(Capabilities {
            replicas: 2,
            etcd: true,
            netns: false,
            pool: false,
            durable: false,
        });
        assert!(two.kinds().contains(&FaultKind::Kill));
        assert!(two.kinds().contains(&FaultKind::EtcdKill));
        // One copy of durable nodes survives a kill when the ring keeps naming the dead
        // node (a file topology), not on etcd, whose lease takes it out.
        let durable = Capabilities {
            durable: true,
            ..ONE_COPY
        };
        assert!(Mix::default_for(durable).kinds().contains(&FaultKind::Kill));
        let on_etcd = Capabilities {
            etcd: true,
            ..durable
        };
        assert!(!Mix::default_for(on_etcd).kinds().contains(&FaultKind::Kill));
        assert!(!Mix::default_for(durable)
            .kinds()
            .contains(&FaultKind::Flush));
        assert!(Mix::parse("etcd-kill", ONE_COPY).is_err());
        assert!(Mix::parse("partition", ONE_COPY).is_err());
        assert!(Mix::parse("pause,bogus", ONE_COPY).is_err());
        assert_eq!(
            Mix::parse("flush, pause,flush", ONE_COPY).unwrap().kinds(),
            [FaultKind::Flush, FaultKind::Pause]
        );
    }
}
