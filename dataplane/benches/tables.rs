//! `TableBuilder::build` + `TablesHandle::publish` at 10,000 Services x 10 backends and 1,000
//! x 100 (issue 14): one backend of one Service changed, one Service added, one removed, and a
//! full build with a fresh builder; for the default (`random`) scheduler and `mh` (Maglev).
//! The spec is made the way a translator hands it over: the Services that did not change
//! keep their `Arc`.
//!
//! Run: `cargo bench -p dataplane --bench tables` (prints `NAME VALUE UNIT` lines; `--quick`
//! for fewer samples; `--full-only` for the full builds alone; a word such as `B.default` runs
//! only the cases named so). Only the builder and the publication are timed, not the translation
//! from Kubernetes objects (that is `make bench-cp`). Compare A/B in one run of the same
//! source at two commits: the 2-core VM is noisy.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::tables::{
    BackendSpec, EmptyAction, ForwardingMode, Frontend, FrontendKind, L4Proto, Scheduler, ServiceSpec, TableBuilder,
    TablesHandle, TablesSpec,
};

fn addr(i: u32) -> IpAddr {
    let [a, b, c, d] = i.to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(10 + a, b, c, d))
}

/// Service `i` of `per` backends; `salt` moves its last backend (a changed endpoint).
fn service(i: u32, per: u32, scheduler: Scheduler, salt: u32) -> Arc<ServiceSpec> {
    let vip = IpAddr::V4(Ipv4Addr::new(172, 16 + (i >> 16) as u8, (i >> 8) as u8, i as u8));
    let backends = (0..per)
        .map(|j| {
            let a = if j + 1 == per && salt > 0 { addr(0x0f00_0000 + salt) } else { addr(0x0010_0000 + i * per + j) };
            BackendSpec::ready(a, 8080)
        })
        .collect();
    Arc::new(ServiceSpec {
        name: format!("ns/s{i:06}:http"),
        frontends: vec![Frontend::new(vip, L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
        scheduler,
        affinity_timeout_s: None,
        mode: ForwardingMode::Nat,
        when_empty: EmptyAction::Reject,
        backends,
    })
}

fn percentile(d: &mut [Duration], p: u32) -> f64 {
    d.sort_unstable();
    let i = (d.len().saturating_sub(1) * p as usize).div_ceil(100);
    d.get(i).map_or(f64::NAN, |x| x.as_secs_f64() * 1e3)
}

fn report(name: &str, mut d: Vec<Duration>) {
    println!("{name}.p50 {:.3} ms", percentile(&mut d, 50));
    println!("{name}.p99 {:.3} ms", percentile(&mut d, 99));
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let full_only = std::env::args().any(|a| a == "--full-only");
    // A word that is not a flag picks the cases whose name contains it (e.g. `B.default`).
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let samples = if quick { 20 } else { 200 };
    for (profile, n, per) in [("A", 10_000u32, 10u32), ("B", 1_000, 100)] {
        for (sname, scheduler) in [("default", Scheduler::Random), ("mh", Scheduler::Maglev { port: true })] {
            let prefix = format!("tables.{profile}.{sname}");
            if filter.as_ref().is_some_and(|f| !prefix.contains(f.as_str())) {
                continue;
            }
            let mut spec =
                TablesSpec { services: (0..n).map(|i| service(i, per, scheduler, 0)).collect(), ..Default::default() };
            // Full builds, fresh builder each.
            let full: Vec<Duration> = (0..if quick { 3 } else { 9 })
                .map(|_| {
                    let t = Instant::now();
                    let mut b = TableBuilder::new();
                    let h = TablesHandle::default();
                    h.publish(b.build(&spec).expect("builds"));
                    t.elapsed()
                })
                .collect();
            report(&format!("{prefix}.full_build"), full);
            if full_only {
                continue;
            }
            let mut b = TableBuilder::new();
            let h = TablesHandle::new(b.build(&spec).expect("builds"));
            // One backend of one Service changed.
            let mut change = Vec::with_capacity(samples);
            for k in 0..samples as u32 {
                let i = (k * 7919) % n;
                spec.services[i as usize] = service(i, per, scheduler, k + 1);
                let t = Instant::now();
                h.publish(b.build(&spec).expect("builds"));
                change.push(t.elapsed());
            }
            report(&format!("{prefix}.change"), change);
            // One Service added, then removed again.
            let (mut add, mut remove) = (Vec::new(), Vec::new());
            for k in 0..samples as u32 {
                spec.services.push(service(n + k, per, scheduler, 0));
                let t = Instant::now();
                h.publish(b.build(&spec).expect("builds"));
                add.push(t.elapsed());
                spec.services.pop();
                let t = Instant::now();
                h.publish(b.build(&spec).expect("builds"));
                remove.push(t.elapsed());
            }
            report(&format!("{prefix}.add_service"), add);
            report(&format!("{prefix}.remove_service"), remove);
        }
    }
}
