//! RFC 2544 §26.1-style throughput search: the highest offered rate whose loss stays at or
//! under a threshold, found by binary search between 0 and the generator's as-fast-as-possible
//! rate.
//!
//! The search is a pure function over a trial closure (`rate_pps` → measured [`Trial`]), so it
//! is tested with fake devices. Procedure:
//! 1. one trial as fast as possible (target rate 0); its measured TX rate is the upper bound.
//!    If its loss is within the threshold, that rate is the answer (the generator, not the
//!    device, is the limit) and the search stops;
//! 2. otherwise `trials` bisection trials on [0, upper]: a rate is accepted when its loss is
//!    within the threshold (the lower bound moves up), else rejected (the upper bound moves
//!    down).
//!
//! The answer (`no_drop_pps`) is the *measured* TX rate of the best accepted trial (what was
//! really offered, which can be a little under the target), or 0 if none was accepted.

/// One trial's outcome.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Trial {
    /// Target rate (0 = as fast as possible).
    pub rate_pps: f64,
    /// Measured TX rate.
    pub tx_pps: f64,
    /// Measured RX rate.
    pub rx_pps: f64,
    /// Loss fraction, 0..1.
    pub loss: f64,
}

/// The search result.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SearchOutcome {
    /// Highest measured offered rate with loss ≤ threshold (0 if none).
    pub no_drop_pps: f64,
    /// The threshold used.
    pub loss_threshold: f64,
    /// All trials in order, the as-fast-as-possible one first.
    pub trials: Vec<Trial>,
}

/// Runs the search. `trial(rate)` runs one trial at `rate` pps (0 = as fast as possible).
///
/// # Errors
/// The first error a trial returns.
pub fn no_drop_search<E>(
    trials: u32,
    loss_threshold: f64,
    mut trial: impl FnMut(f64) -> Result<Trial, E>,
) -> Result<SearchOutcome, E> {
    let mut out = SearchOutcome { no_drop_pps: 0.0, loss_threshold, trials: Vec::new() };
    let first = trial(0.0)?;
    let max = first.tx_pps;
    let ok = first.loss <= loss_threshold;
    out.trials.push(first);
    if ok {
        out.no_drop_pps = max;
        return Ok(out);
    }
    let (mut lo, mut hi) = (0.0f64, max);
    for _ in 0..trials {
        let mid = (lo + hi) / 2.0;
        if mid < 1.0 {
            break;
        }
        let t = trial(mid)?;
        if t.loss <= loss_threshold {
            lo = mid;
            out.no_drop_pps = out.no_drop_pps.max(t.tx_pps);
        } else {
            hi = mid;
        }
        out.trials.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake device: forwards up to `cap` pps, loses the excess; the generator reaches
    /// `gen_max` at most.
    fn device(cap: f64, gen_max: f64) -> impl FnMut(f64) -> Result<Trial, ()> {
        move |rate| {
            let tx = if rate == 0.0 { gen_max } else { rate.min(gen_max) };
            let rx = tx.min(cap);
            Ok(Trial { rate_pps: rate, tx_pps: tx, rx_pps: rx, loss: (tx - rx) / tx })
        }
    }

    #[test]
    fn converges_on_the_device_capacity() {
        let r = no_drop_search(8, 0.001, device(300_000.0, 1_000_000.0)).unwrap();
        assert_eq!(r.trials.len(), 9);
        assert_eq!(r.trials[0].rate_pps, 0.0);
        // After 8 halvings of [0, 1M] the bracket is 3.9 kpps wide, below the capacity.
        assert!(r.no_drop_pps <= 300_000.0 * 1.001);
        assert!(r.no_drop_pps > 300_000.0 - 1_000_000.0 / 256.0, "{}", r.no_drop_pps);
        // Bisection: first midpoint is half the maximum, then it moves toward the capacity.
        assert_eq!(r.trials[1].rate_pps, 500_000.0);
        assert_eq!(r.trials[2].rate_pps, 250_000.0);
        assert_eq!(r.trials[3].rate_pps, 375_000.0);
    }

    #[test]
    fn threshold_accepts_small_loss() {
        // Capacity 99.95% of 1 Mpps: as-fast-as-possible loses 0.05% < 0.1%: accepted at once.
        let r = no_drop_search(8, 0.001, device(999_500.0, 1_000_000.0)).unwrap();
        assert_eq!(r.trials.len(), 1);
        assert_eq!(r.no_drop_pps, 1_000_000.0);
        // With a zero threshold the same device needs the search.
        let r = no_drop_search(8, 0.0, device(999_500.0, 1_000_000.0)).unwrap();
        assert_eq!(r.trials.len(), 9);
        assert!(r.no_drop_pps <= 999_500.0);
    }

    #[test]
    fn nothing_accepted_and_errors() {
        let r = no_drop_search(5, 0.001, device(0.0, 100_000.0)).unwrap();
        assert_eq!(r.no_drop_pps, 0.0);
        assert_eq!(r.trials.len(), 6);
        assert!(r.trials.iter().all(|t| t.loss > 0.001));
        let mut n = 0;
        let e = no_drop_search(5, 0.001, |_| {
            n += 1;
            if n == 3 { Err("boom") } else { device(1.0, 100.0)(10.0).map_err(|()| "device") }
        });
        assert_eq!(e, Err("boom"));
    }

    #[test]
    fn accepted_rate_is_the_measured_one() {
        // The generator only reaches 90% of any target: the answer is what it really sent.
        let mut dev = device(400_000.0, 1_000_000.0);
        let r = no_drop_search(6, 0.001, |rate| {
            let mut t = dev(if rate == 0.0 { 0.0 } else { rate * 0.9 })?;
            t.rate_pps = rate;
            Ok::<_, ()>(t)
        })
        .unwrap();
        let best =
            r.trials.iter().filter(|t| t.loss <= 0.001 && t.rate_pps > 0.0).map(|t| t.tx_pps).fold(0.0, f64::max);
        assert_eq!(r.no_drop_pps, best);
        assert!(best <= 400_000.0 && best > 0.0);
    }
}
