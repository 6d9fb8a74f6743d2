//! RFC 2544 §26.1-style throughput search: the highest offered rate whose loss stays at or
//! under a threshold, found by binary search between 0 and the generator's as-fast-as-possible
//! rate.
//!
//! The search is a pure function over a trial closure (`rate_pps` → measured [`Trial`]), so it
//! is tested with fake devices. Procedure:
//! 1. one trial as fast as possible (target rate 0); its measured TX rate is the upper bound.
//!    If its loss is within the threshold, that rate is the answer (the generator, not the
//!    device, is the limit) and the search stops;
//! 2. otherwise `trials` bisection steps on [0, upper]: a rate is accepted when the loss of a
//!    trial at it is within the threshold (the lower bound moves up), else rejected (the upper
//!    bound moves down). A trial over the threshold is run again at the same rate, up to
//!    `retries` times, before the rate is rejected: one stall of the host (a few milliseconds
//!    without the forwarder's core costs thousands of frames at these rates) would otherwise
//!    reject a rate the forwarder carries, and every later step would search below it. A rate
//!    the forwarder cannot carry loses again in its retries. This is the idea of the goal
//!    exceed ratio of MLRsearch (draft-ietf-bmwg-mlrsearch): a load is judged on more than one
//!    trial, and some of them may exceed the loss goal. Retries are not bisection steps: they
//!    add trials, not precision.
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
    /// All trials in order, the as-fast-as-possible one first; a retry follows the trial it
    /// repeats, at the same rate.
    pub trials: Vec<Trial>,
}

/// Runs the search: `trials` bisection steps, each of one trial plus at most `retries` more at
/// the same rate while they lose more than `loss_threshold` (a fraction, 0..1). `trial(rate)`
/// runs one trial at `rate` pps (0 = as fast as possible).
///
/// # Errors
/// The first error a trial returns.
pub fn no_drop_search<E>(
    trials: u32,
    retries: u32,
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
        let mut accepted = false;
        for _ in 0..=retries {
            let t = trial(mid)?;
            let tx = t.tx_pps;
            accepted = t.loss <= loss_threshold;
            out.trials.push(t);
            if accepted {
                out.no_drop_pps = out.no_drop_pps.max(tx);
                break;
            }
        }
        if accepted {
            lo = mid;
        } else {
            hi = mid;
        }
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
        let r = no_drop_search(8, 0, 0.001, device(300_000.0, 1_000_000.0)).unwrap();
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
        let r = no_drop_search(8, 0, 0.001, device(999_500.0, 1_000_000.0)).unwrap();
        assert_eq!(r.trials.len(), 1);
        assert_eq!(r.no_drop_pps, 1_000_000.0);
        // With a zero threshold the same device needs the search.
        let r = no_drop_search(8, 0, 0.0, device(999_500.0, 1_000_000.0)).unwrap();
        assert_eq!(r.trials.len(), 9);
        assert!(r.no_drop_pps <= 999_500.0);
    }

    #[test]
    fn nothing_accepted_and_errors() {
        let r = no_drop_search(5, 0, 0.001, device(0.0, 100_000.0)).unwrap();
        assert_eq!(r.no_drop_pps, 0.0);
        assert_eq!(r.trials.len(), 6);
        assert!(r.trials.iter().all(|t| t.loss > 0.001));
        let mut n = 0;
        let e = no_drop_search(5, 0, 0.001, |_| {
            n += 1;
            if n == 3 { Err("boom") } else { device(1.0, 100.0)(10.0).map_err(|()| "device") }
        });
        assert_eq!(e, Err("boom"));
    }

    #[test]
    fn accepted_rate_is_the_measured_one() {
        // The generator only reaches 90% of any target: the answer is what it really sent.
        let mut dev = device(400_000.0, 1_000_000.0);
        let r = no_drop_search(6, 0, 0.001, |rate| {
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

    /// `device` whose trial number `stall` (0 = the as-fast-as-possible one) loses 1 % of what
    /// it would forward, as when the host takes the forwarder's core for a few milliseconds.
    fn device_with_stall(cap: f64, gen_max: f64, stall: usize) -> impl FnMut(f64) -> Result<Trial, ()> {
        let (mut dev, mut n) = (device(cap, gen_max), 0);
        move |rate| {
            let mut t = dev(rate)?;
            if n == stall {
                t.rx_pps *= 0.99;
                t.loss = (t.tx_pps - t.rx_pps) / t.tx_pps;
            }
            n += 1;
            Ok(t)
        }
    }

    #[test]
    fn a_stall_in_one_trial_does_not_reject_a_rate_the_device_carries() {
        // Trial 2 is the second bisection step, at 250 kpps, under the 300 kpps capacity.
        let r = no_drop_search(8, 0, 0.001, device_with_stall(300_000.0, 1_000_000.0, 2)).unwrap();
        assert_eq!(r.trials[2].rate_pps, 250_000.0);
        assert!(r.trials[2].loss > 0.001);
        // Without retries the stall rejects 250 kpps and every later step searches below it.
        assert!(r.no_drop_pps < 250_000.0, "{}", r.no_drop_pps);
        // With one retry, 500 kpps takes trials 1 and 2 (both lose: over the capacity), the
        // stall hits trial 3, the first at 250 kpps; its retry is accepted and the search
        // goes on upwards as without the stall.
        let r = no_drop_search(8, 1, 0.001, device_with_stall(300_000.0, 1_000_000.0, 3)).unwrap();
        let rates: Vec<f64> = r.trials.iter().take(6).map(|t| t.rate_pps).collect();
        assert_eq!(rates, [0.0, 500_000.0, 500_000.0, 250_000.0, 250_000.0, 375_000.0]);
        assert!(r.trials[3].loss > 0.001 && r.trials[4].loss <= 0.001);
        assert!(r.no_drop_pps > 300_000.0 - 1_000_000.0 / 256.0, "{}", r.no_drop_pps);
        assert!(r.no_drop_pps <= 300_000.0 * 1.001);
    }

    #[test]
    fn a_rate_over_the_capacity_is_rejected_after_every_retry() {
        let r = no_drop_search(8, 2, 0.001, device(300_000.0, 1_000_000.0)).unwrap();
        // Of the 8 steps, 500, 375, 312.5 kpps and the steps above the capacity after them
        // lose in all three of their trials; every accepted step takes one.
        let rejected = r.trials.iter().skip(1).filter(|t| t.loss > 0.001).count();
        let accepted = r.trials.iter().skip(1).filter(|t| t.loss <= 0.001).count();
        assert_eq!(rejected % 3, 0, "{:?}", r.trials);
        assert_eq!(rejected / 3 + accepted, 8);
        assert_eq!(r.trials.len(), 1 + rejected + accepted);
        assert!(r.trials.iter().skip(1).filter(|t| t.loss > 0.001).all(|t| t.rate_pps > 300_000.0));
        assert!(r.no_drop_pps <= 300_000.0 * 1.001);
        assert!(r.no_drop_pps > 300_000.0 - 1_000_000.0 / 256.0, "{}", r.no_drop_pps);
    }
}
