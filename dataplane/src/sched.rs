//! IPVS-style schedulers: pick a backend for a new flow.
//!
//! Per-worker state ([`SchedState`]) holds round-robin positions, smooth-WRR current
//! weights, the random generator and the connection counts that conntrack maintains
//! ([`ConnCounts`]). Counts are **per worker** (IPVS keeps one global count per real server);
//! with RSS spreading flows evenly the per-worker minimum approximates the global one without
//! sharing a cache line per new flow. Documented in docs/architecture.md.
//!
//! Sources: ipvsadm(8); Linux `net/netfilter/ipvs/ip_vs_{rr,wrr,lc,wlc,sh,dh,sed,nq,mh}.c`;
//! kube-proxy's random choice (seed SCHED-01); Maglev NSDI'16 §3.4 via [`crate::maglev`].

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use crate::maglev;
use crate::tables::{BackendRef, Scheduler, Service, Tables};

/// Active and inactive connection counts per backend slot, on one worker.
#[derive(Debug, Default)]
pub struct ConnCounts {
    slots: Vec<Count>,
}

#[derive(Copy, Clone, Debug, Default)]
struct Count {
    owner: BackendRef,
    active: u32,
    inactive: u32,
}

impl ConnCounts {
    /// Makes room for `n` slots (called when tables change, never per packet).
    pub fn ensure(&mut self, n: usize) {
        if self.slots.len() < n {
            self.slots.resize(n, Count::default());
        }
    }

    fn slot(&mut self, r: BackendRef) -> Option<&mut Count> {
        let c = self.slots.get_mut(r.index())?;
        if c.owner != r {
            // A new occupant of a reused slot starts from zero.
            *c = Count { owner: r, active: 0, inactive: 0 };
        }
        Some(c)
    }

    /// Prefetches the counts of `r` (the batch's miss stage, before the slow path adds a flow).
    #[inline]
    pub fn prefetch(&self, r: BackendRef) {
        if let Some(c) = self.slots.get(r.index()) {
            crate::prefetch(c);
        }
    }

    /// A flow to `r` appeared, in the active or inactive class.
    #[inline]
    pub fn add(&mut self, r: BackendRef, active: bool) {
        if let Some(c) = self.slot(r) {
            if active {
                c.active = c.active.saturating_add(1);
            } else {
                c.inactive = c.inactive.saturating_add(1);
            }
        }
    }

    /// A flow to `r` went away. A flow of a previous occupant of the slot changes nothing.
    #[inline]
    pub fn sub(&mut self, r: BackendRef, active: bool) {
        if let Some(c) = self.slots.get_mut(r.index())
            && c.owner == r
        {
            if active {
                c.active = c.active.saturating_sub(1);
            } else {
                c.inactive = c.inactive.saturating_sub(1);
            }
        }
    }

    /// A flow changed class (e.g. established → FIN). A flow of a previous occupant of the
    /// slot (a backend that left, whose flows live on) changes nothing: its slot's counts are
    /// the new occupant's.
    #[inline]
    pub fn change(&mut self, r: BackendRef, was_active: bool, is_active: bool) {
        if was_active == is_active {
            return;
        }
        if let Some(c) = self.slots.get_mut(r.index())
            && c.owner == r
        {
            let (from, to) =
                if was_active { (&mut c.active, &mut c.inactive) } else { (&mut c.inactive, &mut c.active) };
            *from = from.saturating_sub(1);
            *to = to.saturating_add(1);
        }
    }

    /// (active, inactive) for `r`.
    #[inline]
    pub fn get(&self, r: BackendRef) -> (u32, u32) {
        match self.slots.get(r.index()) {
            Some(c) if c.owner == r => (c.active, c.inactive),
            _ => (0, 0),
        }
    }
}

/// One service's rotation (`rr`, `wrr`), kept across tables generations while the service's
/// scheduler and eligible backends stay ([`SchedState::sync`]).
#[derive(Debug, Default, Clone)]
struct SvcState {
    /// `rr`: index in the eligible backends of the next one.
    rr_next: u32,
    /// `wrr`: smooth WRR's current weight per eligible backend.
    wrr_current: Vec<i64>,
    /// The scheduler this state was kept for (`None`: a service without rotation, or no
    /// service under this id).
    scheduler: Option<Scheduler>,
    /// The eligible backends this state was kept for, in their order.
    eligible: Box<[BackendRef]>,
}

impl SvcState {
    /// Brings the state of a `rr` or `wrr` service up to date with `s` (a new build of it, or
    /// the same). Unchanged scheduler and eligible backends: nothing changes, so another
    /// service's change does not move this one's rotation (IPVS keeps each service's position
    /// across the others' changes). Changed eligible backends: `rr`'s cursor stays on the
    /// backend it pointed at if that one is still eligible, else at the same position modulo
    /// the new number (`ip_vs_rr.c` moves its cursor only off a removed server); `wrr` keeps
    /// the current weight of each backend still eligible, a new one starts at 0, and all are
    /// shifted so that they sum to 0 again, as smooth WRR's do after every pick. Allocates;
    /// called by `sync` only.
    fn follow(&mut self, s: &Service) {
        if self.scheduler == Some(s.scheduler) && *self.eligible == *s.eligible {
            return;
        }
        let same_sched = self.scheduler == Some(s.scheduler);
        let n = s.eligible.len();
        let next = self.eligible.get(self.rr_next as usize).and_then(|r| s.eligible.iter().position(|e| e == r));
        let rr_next = match next {
            Some(i) => i,
            None if n > 0 => self.rr_next as usize % n,
            None => 0,
        };
        self.rr_next = u32::try_from(rr_next).unwrap_or(0);
        let mut current = vec![0i64; if s.scheduler == Scheduler::WeightedRoundRobin { n } else { 0 }];
        if same_sched && !current.is_empty() && self.wrr_current.len() == self.eligible.len() {
            let mut old: Vec<(BackendRef, i64)> =
                self.eligible.iter().copied().zip(self.wrr_current.iter().copied()).collect();
            old.sort_unstable_by_key(|&(r, _)| r.0);
            for (c, r) in current.iter_mut().zip(s.eligible.iter()) {
                if let Ok(i) = old.binary_search_by_key(&r.0, |&(r, _)| r.0)
                    && let Some(&(_, v)) = old.get(i)
                {
                    *c = v;
                }
            }
            let sum: i64 = current.iter().sum();
            let len = i64::try_from(current.len()).unwrap_or(i64::MAX);
            let (q, rem) = (sum.div_euclid(len), sum.rem_euclid(len));
            for (i, c) in current.iter_mut().enumerate() {
                *c -= q + i64::from(i64::try_from(i).unwrap_or(i64::MAX) < rem);
            }
        }
        self.wrr_current = current;
        self.scheduler = Some(s.scheduler);
        self.eligible = s.eligible.clone();
    }
}

/// Per-worker scheduler state.
#[derive(Debug)]
pub struct SchedState {
    generation: u64,
    per_service: Vec<SvcState>,
    rng: u64,
    /// Connection counts, maintained by the pipeline as flows come and go.
    pub conns: ConnCounts,
}

/// What a scheduler may look at in the packet.
#[derive(Copy, Clone, Debug)]
pub struct FlowInfo<'a> {
    /// Client address octets (4 or 16).
    pub src: &'a [u8],
    /// Client port.
    pub sport: u16,
    /// Destination (frontend) address octets.
    pub dst: &'a [u8],
}

impl SchedState {
    /// State seeded with `seed` (use a per-worker random value).
    pub fn new(seed: u64) -> Self {
        Self { generation: u64::MAX, per_service: Vec::new(), rng: seed | 1, conns: ConnCounts::default() }
    }

    /// Adapts to a new tables snapshot: keeps each `rr` and `wrr` service's rotation by its
    /// stable id ([`Service::id`]), adapting it only when that service's own scheduler or
    /// eligible backends changed (`SvcState::follow`), drops the state of ids without such a
    /// service, and grows the count slots. Allocates; call once per batch, not per packet
    /// (it returns at once while the generation stays).
    #[inline]
    pub fn sync(&mut self, t: &Tables) {
        if self.generation != t.generation {
            self.resync(t);
        }
    }

    /// [`SchedState::sync`] for a new generation. Out of line, so that the check of every
    /// batch stays a comparison in the caller.
    #[inline(never)]
    fn resync(&mut self, t: &Tables) {
        self.generation = t.generation;
        // Indexed by service id (`FrontendEntry::service`); ids not in use get an empty state.
        self.per_service.resize_with(t.services.len(), SvcState::default);
        for (id, st) in self.per_service.iter_mut().enumerate() {
            match t.services.get(id) {
                Some(s) if matches!(s.scheduler, Scheduler::RoundRobin | Scheduler::WeightedRoundRobin) => st.follow(s),
                _ => *st = SvcState::default(),
            }
        }
        self.conns.ensure(t.backends.len());
    }

    /// The random scheduler's draw (SCHED-01): a uniform value below the service's total weight
    /// (`cum_weights`' last), then the eligible backend whose cumulative weight first exceeds
    /// it. `None`, drawing nothing, if the service has no eligible backend or no weight.
    /// [`SchedState::pick`] draws this way for [`Scheduler::Random`]; the batch's direct route
    /// for new flows calls it without `pick`'s dispatch.
    #[inline(always)]
    pub fn draw_random(&mut self, svc: &Service) -> Option<BackendRef> {
        draw_random(&mut self.rng, svc)
    }

    /// The generator's state, for [`RandomPeek`]: what the next draws will be, without drawing.
    #[inline]
    pub fn peek(&self) -> RandomPeek {
        RandomPeek(self.rng)
    }
}

/// A copy of a worker's generator ([`SchedState::peek`]): [`RandomPeek::draw_random`] gives
/// the backends that [`SchedState::draw_random`] will give, in order, as long as nothing else
/// draws meanwhile. The batch's miss stage uses it to prefetch the reply buckets of the new
/// flows that stage 5 will draw for (a wrong guess only wastes the prefetch).
#[derive(Copy, Clone, Debug)]
pub struct RandomPeek(u64);

impl RandomPeek {
    /// The next draw for service `svc` (see [`SchedState::draw_random`]).
    #[inline(always)]
    pub fn draw_random(&mut self, svc: &Service) -> Option<BackendRef> {
        draw_random(&mut self.0, svc)
    }
}

/// xorshift64* (Vigna 2016) on state `x`: fast, not cryptographic; only spreads load.
#[inline(always)]
fn next_random(x: &mut u64) -> u64 {
    let mut v = *x;
    v ^= v >> 12;
    v ^= v << 25;
    v ^= v >> 27;
    *x = v;
    v.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// [`SchedState::draw_random`] on generator state `rng`.
#[inline(always)]
fn draw_random(rng: &mut u64, svc: &Service) -> Option<BackendRef> {
    let total = svc.cum_weights.last().copied().unwrap_or(0);
    if svc.eligible.is_empty() || total == 0 {
        return None;
    }
    let x = u32::try_from(next_random(rng) % u64::from(total)).unwrap_or(0);
    // Every eligible backend weighs at least 1, so a total equal to their number means all
    // weigh 1 (Kubernetes endpoints carry no weight): `cum_weights` is then 1..=n and the
    // backend is the `x`-th, without the search.
    let i =
        if total as usize == svc.eligible.len() { x as usize } else { svc.cum_weights.partition_point(|&c| c <= x) };
    svc.eligible.get(i).copied()
}

impl SchedState {
    /// Picks a backend of service `si` for a new flow; `None` if it has no eligible backend.
    /// No allocation.
    #[inline]
    pub fn pick(&mut self, si: usize, svc: &Service, f: FlowInfo<'_>) -> Option<BackendRef> {
        let n = svc.eligible.len();
        if n == 0 {
            return None;
        }
        let idx = match svc.scheduler {
            Scheduler::Random => return self.draw_random(svc),
            Scheduler::Maglev { port } => {
                let h = maglev::source_hash(f.src, port.then_some(f.sport));
                svc.maglev.as_ref().map_or(0, |m| m.lookup(h) as usize)
            }
            Scheduler::RoundRobin => {
                let st = self.per_service.get_mut(si)?;
                let i = st.rr_next as usize % n;
                st.rr_next = u32::try_from((i + 1) % n).unwrap_or(0);
                i
            }
            Scheduler::WeightedRoundRobin => self.smooth_wrr(si, svc)?,
            Scheduler::LeastConnection => self.min_by(svc, |a, i, _w| (u64::from(a) << 8) + u64::from(i), |x, y| x < y),
            Scheduler::WeightedLeastConnection => {
                // overhead_a * w_b < overhead_b * w_a (ip_vs_wlc.c), compared as u128.
                self.min_weighted(svc, |a, i| (u64::from(a) << 8) + u64::from(i))
            }
            Scheduler::ShortestExpectedDelay => self.min_weighted(svc, |a, _| u64::from(a) + 1),
            Scheduler::NeverQueue => match svc.eligible.iter().position(|&r| self.conns.get(r).0 == 0) {
                Some(i) => i,
                None => self.min_weighted(svc, |a, _| u64::from(a) + 1),
            },
            Scheduler::SourceHash => bucket(svc, f.src),
            Scheduler::DestinationHash => bucket(svc, f.dst),
        };
        svc.eligible.get(idx).copied()
    }

    /// nginx's smooth weighted round robin: add each weight to its current value, pick the
    /// largest, subtract the total from it. Same proportions as IPVS wrr, better interleaving.
    fn smooth_wrr(&mut self, si: usize, svc: &Service) -> Option<usize> {
        let st = self.per_service.get_mut(si)?;
        if st.wrr_current.len() != svc.weights.len() {
            return Some(0);
        }
        let mut best = 0usize;
        let mut best_v = i64::MIN;
        let mut total = 0i64;
        for (i, (c, &w)) in st.wrr_current.iter_mut().zip(svc.weights.iter()).enumerate() {
            *c += i64::from(w);
            total += i64::from(w);
            if *c > best_v {
                best_v = *c;
                best = i;
            }
        }
        if let Some(c) = st.wrr_current.get_mut(best) {
            *c -= total;
        }
        Some(best)
    }

    fn min_by(&self, svc: &Service, cost: impl Fn(u32, u32, u16) -> u64, less: impl Fn(u64, u64) -> bool) -> usize {
        let mut best = 0usize;
        let mut best_c = u64::MAX;
        for (i, (&r, &w)) in svc.eligible.iter().zip(svc.weights.iter()).enumerate() {
            let (a, ina) = self.conns.get(r);
            let c = cost(a, ina, w);
            if i == 0 || less(c, best_c) {
                best = i;
                best_c = c;
            }
        }
        best
    }

    /// Minimises `cost / weight` without division: `c_i * w_best < c_best * w_i`.
    fn min_weighted(&self, svc: &Service, cost: impl Fn(u32, u32) -> u64) -> usize {
        let mut best = 0usize;
        let (mut bc, mut bw) = (u128::MAX, 1u128);
        for (i, (&r, &w)) in svc.eligible.iter().zip(svc.weights.iter()).enumerate() {
            let (a, ina) = self.conns.get(r);
            let c = u128::from(cost(a, ina));
            let w = u128::from(w.max(1));
            if i == 0 || c * bw < bc * w {
                best = i;
                bc = c;
                bw = w;
            }
        }
        best
    }
}

/// `sh`/`dh`: hash the address (fixed hash, same as Maglev's) into the 256-bucket table.
#[inline]
fn bucket(svc: &Service, addr: &[u8]) -> usize {
    let n = svc.hash_buckets.len();
    if n == 0 {
        return 0;
    }
    let h = maglev::source_hash(addr, None);
    svc.hash_buckets.get((h % n as u64) as usize).copied().unwrap_or(0) as usize
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;
    use crate::tables::*;

    fn tables(sched: Scheduler, weights: &[u16]) -> Tables {
        let spec = TablesSpec {
            services: vec![std::sync::Arc::new(ServiceSpec {
                name: "s".into(),
                frontends: vec![Frontend {
                    addr: "10.96.0.1".parse().unwrap(),
                    proto: L4Proto::Tcp,
                    port: 80,
                    kind: FrontendKind::ClusterIp,
                    masquerade: false,
                    source_ranges: vec![],
                }],
                scheduler: sched,
                affinity_timeout_s: None,
                mode: ForwardingMode::Nat,
                when_empty: EmptyAction::Reject,
                backends: weights
                    .iter()
                    .enumerate()
                    .map(|(i, &w)| BackendSpec {
                        addr: format!("10.0.0.{}", i + 1).parse().unwrap(),
                        port: 80,
                        weight: w,
                        eligible: true,
                        conditions: Conditions::default(),
                        node_local: false,
                    })
                    .collect(),
            })],
            ..Default::default()
        };
        TableBuilder::new().build(&spec).unwrap()
    }

    fn counts(sched: Scheduler, weights: &[u16], n: usize, hold: bool) -> Vec<usize> {
        let t = tables(sched, weights);
        let mut st = SchedState::new(42);
        st.sync(&t);
        let svc = &t.services[0];
        let mut out = vec![0; weights.len()];
        for i in 0..n {
            let src = (i as u32).to_be_bytes();
            let r = st.pick(0, svc, FlowInfo { src: &src, sport: i as u16, dst: &[10, 96, 0, 1] }).unwrap();
            if hold {
                st.conns.add(r, true);
            }
            let pos = svc.eligible.iter().position(|&e| e == r).unwrap();
            out[pos] += 1;
        }
        out
    }

    #[test]
    fn rr_cycles_through_backends_in_order() {
        assert_eq!(counts(Scheduler::RoundRobin, &[1, 1, 1], 9, false), vec![3, 3, 3]);
    }

    #[test]
    fn wrr_follows_weights_exactly_over_a_cycle() {
        assert_eq!(counts(Scheduler::WeightedRoundRobin, &[5, 1, 1], 70, false), vec![50, 10, 10]);
    }

    #[test]
    fn random_is_roughly_uniform() {
        let c = counts(Scheduler::Random, &[1, 1, 1, 1], 40_000, false);
        for x in c {
            assert!((9_000..11_000).contains(&x), "{x}");
        }
    }

    #[test]
    fn random_follows_weights() {
        let c = counts(Scheduler::Random, &[3, 1, 0], 40_000, false);
        assert!((29_000..31_000).contains(&c[0]) && (9_000..11_000).contains(&c[1]) && c[2] == 0, "{c:?}");
    }

    #[test]
    fn random_with_weights_of_one_draws_what_the_search_draws() {
        for n in 1..=12u16 {
            let t = tables(Scheduler::Random, &vec![1; usize::from(n)]);
            let svc = &t.services[0];
            let mut st = SchedState::new(u64::from(n) * 7919);
            let mut model = SchedState::new(u64::from(n) * 7919);
            for _ in 0..200 {
                let x = u32::try_from(next_random(&mut model.rng) % u64::from(n)).unwrap();
                let want = svc.eligible.get(svc.cum_weights.partition_point(|&c| c <= x)).copied();
                assert_eq!(st.draw_random(svc), want, "{n} backends");
            }
        }
    }

    #[test]
    fn a_peek_draws_what_the_generator_will_draw() {
        let t = tables(Scheduler::Random, &[1, 2, 3]);
        let svc = &t.services[0];
        let mut st = SchedState::new(99);
        st.draw_random(svc);
        let mut peek = st.peek();
        let ahead: Vec<_> = (0..32).map(|_| peek.draw_random(svc)).collect();
        let drawn: Vec<_> = (0..32).map(|_| st.draw_random(svc)).collect();
        assert_eq!(ahead, drawn);
    }

    #[test]
    fn random_draws_nothing_for_a_service_without_weight() {
        let (empty, zero, some) =
            (tables(Scheduler::Random, &[]), tables(Scheduler::Random, &[0, 0]), tables(Scheduler::Random, &[1, 1, 1]));
        let mut st = SchedState::new(42);
        assert_eq!(st.draw_random(&empty.services[0]), None);
        assert_eq!(st.draw_random(&zero.services[0]), None);
        let got: Vec<_> = (0..16).map(|_| st.draw_random(&some.services[0])).collect();
        let mut fresh = SchedState::new(42);
        let want: Vec<_> = (0..16).map(|_| fresh.draw_random(&some.services[0])).collect();
        assert_eq!(got, want, "a draw without weight moved the generator");
    }

    #[test]
    fn lc_balances_held_connections() {
        assert_eq!(counts(Scheduler::LeastConnection, &[1, 1, 1], 30, true), vec![10, 10, 10]);
    }

    #[test]
    fn wlc_and_sed_follow_weights_for_held_connections() {
        assert_eq!(counts(Scheduler::WeightedLeastConnection, &[2, 1], 30, true), vec![20, 10]);
        let s = counts(Scheduler::ShortestExpectedDelay, &[2, 1], 30, true);
        assert!(s[0] >= 19 && s[0] <= 21, "{s:?}");
    }

    #[test]
    fn nq_prefers_idle_backends_first() {
        let c = counts(Scheduler::NeverQueue, &[1, 1, 1], 3, true);
        assert_eq!(c, vec![1, 1, 1]);
        // With equal weights every balancing scheduler gives that. With one heavy backend, sed
        // alone gives it the first three flows (expected delays 1/4, 2/4, 3/4 against 1/1);
        // nq gives each idle backend one first, then is sed.
        assert_eq!(counts(Scheduler::ShortestExpectedDelay, &[4, 1, 1], 3, true), vec![3, 0, 0]);
        assert_eq!(counts(Scheduler::NeverQueue, &[4, 1, 1], 3, true), vec![1, 1, 1]);
        assert_eq!(counts(Scheduler::NeverQueue, &[4, 1, 1], 6, true), vec![4, 1, 1]);
    }

    #[test]
    fn sh_maps_one_source_to_one_backend_and_mh_too() {
        for sched in [Scheduler::SourceHash, Scheduler::Maglev { port: false }] {
            let t = tables(sched, &[1, 1, 1]);
            let mut st = SchedState::new(1);
            st.sync(&t);
            let f = |p| FlowInfo { src: &[192, 0, 2, 7], sport: p, dst: &[10, 96, 0, 1] };
            let first = st.pick(0, &t.services[0], f(1)).unwrap();
            for p in 2..50 {
                assert_eq!(st.pick(0, &t.services[0], f(p)).unwrap(), first);
            }
            // One backend for every source would pass the above: sources spread over all three.
            let seen: std::collections::HashSet<_> = (0..100u8)
                .map(|i| st.pick(0, &t.services[0], FlowInfo { src: &[192, 0, 2, i], sport: 1, dst: &[10, 96, 0, 1] }))
                .collect();
            assert_eq!(seen.len(), 3, "{sched:?}: 100 sources went to {seen:?}");
        }
    }

    /// `dh` hashes the destination: one destination is one backend whatever the source, and
    /// destinations spread over the backends.
    #[test]
    fn dh_maps_one_destination_to_one_backend_and_spreads_destinations() {
        let t = tables(Scheduler::DestinationHash, &[1, 1, 1]);
        let mut st = SchedState::new(1);
        st.sync(&t);
        let svc = &t.services[0];
        let sources: std::collections::HashSet<_> = (0..100u8)
            .map(|i| st.pick(0, svc, FlowInfo { src: &[192, 0, 2, i], sport: u16::from(i), dst: &[10, 96, 0, 1] }))
            .collect();
        assert_eq!(sources.len(), 1, "one destination from 100 sources went to {sources:?}");
        let destinations: std::collections::HashSet<_> = (0..100u8)
            .map(|i| st.pick(0, svc, FlowInfo { src: &[192, 0, 2, 7], sport: 1, dst: &[10, 96, 1, i] }))
            .collect();
        assert_eq!(destinations.len(), 3, "100 destinations went to {destinations:?}");
    }

    #[test]
    fn mh_with_port_spreads_one_source_over_backends() {
        let t = tables(Scheduler::Maglev { port: true }, &[1, 1, 1]);
        let mut st = SchedState::new(1);
        st.sync(&t);
        let mut seen = std::collections::HashSet::new();
        for p in 0..100 {
            seen.insert(st.pick(0, &t.services[0], FlowInfo { src: &[192, 0, 2, 7], sport: p, dst: &[] }).unwrap());
        }
        assert_eq!(seen.len(), 3);
    }

    #[test]
    fn conn_counts_ignore_flows_of_a_previous_slot_occupant() {
        let mut c = ConnCounts::default();
        c.ensure(4);
        let old = BackendRef(2);
        let new = BackendRef(2 | (1 << 20));
        c.add(old, true);
        c.add(new, true);
        c.sub(old, true);
        assert_eq!(c.get(new), (1, 0));
        // A FIN or RST of the previous occupant's flow (the slow path's reply and established
        // paths change the class of whatever backend the flow names).
        c.change(old, true, false);
        assert_eq!(c.get(new), (1, 0), "the new occupant's counts are kept");
        c.change(new, true, false);
        assert_eq!(c.get(new), (0, 1));
    }

    fn svc_spec(name: &str, vip: [u8; 4], sched: Scheduler, backends: &[([u8; 4], u16)]) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            frontends: vec![Frontend::new(
                std::net::Ipv4Addr::from(vip).into(),
                L4Proto::Tcp,
                80,
                FrontendKind::ClusterIp,
                false,
            )],
            scheduler: sched,
            affinity_timeout_s: None,
            mode: ForwardingMode::Nat,
            when_empty: EmptyAction::Reject,
            backends: backends
                .iter()
                .map(|&(a, p)| BackendSpec::ready(std::net::Ipv4Addr::from(a).into(), p))
                .collect(),
        }
    }

    /// The backend `demo/a` (VIP 10.96.0.1:80) gives one new flow after each of `n` tables
    /// builds of one builder, the services of build `i` from `services(i)`, on one
    /// [`SchedState`] synced to each.
    fn one_pick_per_build(n: u16, services: impl Fn(u16) -> Vec<ServiceSpec>) -> Vec<std::net::IpAddr> {
        let mut b = TableBuilder::new();
        let mut st = SchedState::new(7);
        (0..n)
            .map(|i| {
                let spec = TablesSpec {
                    services: services(i).into_iter().map(std::sync::Arc::new).collect(),
                    ..Default::default()
                };
                let t = b.build(&spec).unwrap();
                st.sync(&t);
                let svc = t.services.iter().find(|s| &*s.name == "demo/a").unwrap();
                let f = FlowInfo { src: &[192, 0, 2, 1], sport: 1000 + i, dst: &[10, 96, 0, 1] };
                let r = st.pick(svc.id as usize, svc, f).unwrap();
                t.backend(r).unwrap().addr
            })
            .collect()
    }

    /// `rr` and `wrr` spread new flows over the backends (SCHED-04) even when the tables change
    /// between two new flows of the service (any other Service's endpoint change publishes new
    /// tables): with one new flow per tables generation, the flows do not all go to the first
    /// backend. IPVS keeps each service's position across the others' changes.
    #[test]
    fn rr_and_wrr_keep_their_rotation_when_another_service_changes_between_new_flows() {
        let mut bad = Vec::new();
        for sched in [Scheduler::RoundRobin, Scheduler::WeightedRoundRobin] {
            let picked: std::collections::BTreeSet<_> = one_pick_per_build(6, |i| {
                vec![
                    svc_spec(
                        "demo/a",
                        [10, 96, 0, 1],
                        sched,
                        &[([10, 0, 0, 1], 80), ([10, 0, 0, 2], 80), ([10, 0, 0, 3], 80)],
                    ),
                    // Another service whose endpoint changes each time.
                    svc_spec("demo/b", [10, 96, 0, 2], Scheduler::RoundRobin, &[([10, 0, 1, 1], 1000 + i)]),
                ]
            })
            .into_iter()
            .collect();
            if picked.len() != 3 {
                bad.push(format!("{sched:?}: six new flows over six tables generations went to {picked:?}"));
            }
        }
        assert!(bad.is_empty(), "{bad:?}");
    }

    /// A change of the service's own backends adapts its rotation rather than restarting it:
    /// with one new flow per change (a fourth backend that comes and goes), the flows to the
    /// three backends that stay do not all go to the first of them.
    #[test]
    fn rr_and_wrr_do_not_restart_at_the_first_backend_when_their_own_backends_change() {
        let mut bad = Vec::new();
        for sched in [Scheduler::RoundRobin, Scheduler::WeightedRoundRobin] {
            let mut picked = std::collections::BTreeMap::new();
            for addr in one_pick_per_build(12, |i| {
                let mut backends = vec![([10, 0, 0, 1], 80), ([10, 0, 0, 2], 80), ([10, 0, 0, 3], 80)];
                if i % 2 == 1 {
                    backends.push(([10, 0, 0, 4], 80));
                }
                vec![svc_spec("demo/a", [10, 96, 0, 1], sched, &backends)]
            }) {
                *picked.entry(addr).or_insert(0) += 1;
            }
            let stayed = picked.iter().filter(|(a, _)| **a != std::net::IpAddr::from([10, 0, 0, 4])).count();
            if stayed != 3 {
                bad.push(format!("{sched:?}: twelve new flows over twelve changes of its backends went to {picked:?}"));
            }
        }
        assert!(bad.is_empty(), "{bad:?}");
    }
}
