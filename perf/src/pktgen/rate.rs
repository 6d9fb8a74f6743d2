//! Token-bucket rate control in batches.
//!
//! Tokens (packets) accrue at `rate` per second up to `burst`. The sender asks for up to one
//! batch at a time and gets a whole number of tokens, but only once at least `chunk` tokens
//! are there, so a high rate is sent in full batches (few `sendto` calls) and a low rate in
//! small chunks (smooth). Times are CLOCK_MONOTONIC nanoseconds passed in by the caller, which
//! keeps the bucket a pure function of its inputs (tested without a clock).

/// A token bucket; rate 0 means unlimited.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    chunk: f64,
    tokens: f64,
    last_ns: u64,
}

impl TokenBucket {
    /// A bucket for `rate_pps` packets per second (0 = unlimited) handing out at most
    /// `batch` packets at a time, starting empty at `now_ns`. The minimum chunk is what the
    /// rate accrues in 100 µs, clamped to `1..=batch`; the burst is two batches or 10 ms worth
    /// of packets, whichever is larger, so that the average rate survives the generator being
    /// preempted for a scheduler time slice on a busy machine (the sender still queues at most
    /// one batch per call).
    pub fn new(rate_pps: f64, batch: usize, now_ns: u64) -> Self {
        let batch = batch.max(1) as f64;
        let chunk = (rate_pps * 100e-6).ceil().clamp(1.0, batch);
        let burst = (2.0 * batch).max(rate_pps * 10e-3);
        Self { rate: rate_pps.max(0.0), burst, chunk, tokens: 0.0, last_ns: now_ns }
    }

    /// Whether the bucket limits anything.
    pub fn unlimited(&self) -> bool {
        self.rate <= 0.0
    }

    fn refill(&mut self, now_ns: u64) {
        if now_ns > self.last_ns {
            let dt = (now_ns - self.last_ns) as f64 * 1e-9;
            self.tokens = (self.tokens + dt * self.rate).min(self.burst);
            self.last_ns = now_ns;
        }
    }

    /// How many packets may be sent now, at most `max`: 0 until a chunk has accrued. The
    /// caller must [`TokenBucket::spend`] what it actually sent.
    pub fn available(&mut self, now_ns: u64, max: usize) -> usize {
        if self.unlimited() {
            return max;
        }
        self.refill(now_ns);
        if self.tokens < self.chunk {
            return 0;
        }
        #[expect(clippy::cast_sign_loss, reason = "tokens are never negative (spend clamps at 0)")]
        let whole = self.tokens.floor() as usize;
        whole.min(max)
    }

    /// Takes `n` tokens (what was sent).
    pub fn spend(&mut self, n: usize) {
        if !self.unlimited() {
            self.tokens = (self.tokens - n as f64).max(0.0);
        }
    }

    /// Nanoseconds from `now_ns` until a chunk will be available (0 if it is already).
    pub fn wait_ns(&mut self, now_ns: u64) -> u64 {
        if self.unlimited() {
            return 0;
        }
        self.refill(now_ns);
        if self.tokens >= self.chunk {
            return 0;
        }
        #[expect(clippy::cast_sign_loss, reason = "tokens < chunk here and the rate is positive")]
        let ns = ((self.chunk - self.tokens) / self.rate * 1e9).ceil() as u64;
        ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives the bucket like the sender does, with a fake clock advancing `step_ns` per
    /// iteration, and returns packets sent over `total_ns` and the largest single batch.
    fn simulate(rate: f64, batch: usize, step_ns: u64, total_ns: u64) -> (u64, usize) {
        let t0 = 1_000_000_000;
        let mut b = TokenBucket::new(rate, batch, t0);
        let (mut sent, mut largest) = (0u64, 0usize);
        let mut now = t0;
        while now < t0 + total_ns {
            let n = b.available(now, batch);
            b.spend(n);
            sent += n as u64;
            largest = largest.max(n);
            now += step_ns;
        }
        (sent, largest)
    }

    #[test]
    fn sends_the_configured_rate() {
        for (rate, batch, step) in
            [(20_000.0, 64, 1_000), (20_000.0, 64, 700_000), (1_000_000.0, 64, 5_000), (3_000_000.0, 256, 50_000)]
        {
            let (sent, largest) = simulate(rate, batch, step, 2_000_000_000);
            let want = rate * 2.0;
            let err = (sent as f64 - want).abs() / want;
            assert!(err < 0.01, "rate {rate} step {step}: sent {sent}, want {want}");
            assert!(largest <= batch);
        }
    }

    #[test]
    fn low_rates_go_in_small_chunks_high_rates_in_batches() {
        // 20 kpps polled every µs: 2-packet chunks (100 µs worth), never a 64 batch.
        let (_, largest) = simulate(20_000.0, 64, 1_000, 100_000_000);
        assert_eq!(largest, 2);
        // 2 Mpps polled every 50 µs: full batches.
        let (_, largest) = simulate(2_000_000.0, 64, 50_000, 10_000_000);
        assert_eq!(largest, 64);
    }

    #[test]
    fn burst_is_bounded_after_idle() {
        let mut b = TokenBucket::new(10_000.0, 64, 0);
        // One second idle would accrue 10,000 tokens; the burst caps it at 2 batches.
        assert_eq!(b.available(1_000_000_000, 10_000), 128);
        b.spend(128);
        assert_eq!(b.available(1_000_000_000, 10_000), 0);
        // 1 ms later: 10 tokens, and the chunk at 10 kpps is 1.
        assert_eq!(b.available(1_001_000_000, 10_000), 10);
        // At 1 Mpps the burst is 10 ms worth: a 5 ms stall is made up, a 50 ms one is not.
        let mut b = TokenBucket::new(1_000_000.0, 64, 0);
        assert_eq!(b.available(5_000_000, 1_000_000), 5_000);
        b.spend(5_000);
        assert_eq!(b.available(55_000_000, 1_000_000), 10_000);
    }

    #[test]
    fn wait_until_next_chunk() {
        let mut b = TokenBucket::new(1_000.0, 64, 0);
        // chunk = 1 packet; empty bucket at 1 kpps: 1 ms to wait.
        assert_eq!(b.wait_ns(0), 1_000_000);
        assert!(b.wait_ns(400_000).abs_diff(600_000) <= 1);
        assert_eq!(b.available(900_000, 64), 0);
        assert_eq!(b.wait_ns(1_000_010), 0);
        assert_eq!(b.available(1_000_010, 64), 1);
    }

    #[test]
    fn unlimited() {
        let mut b = TokenBucket::new(0.0, 64, 0);
        assert!(b.unlimited());
        assert_eq!(b.available(0, 300), 300);
        assert_eq!(b.wait_ns(0), 0);
        b.spend(1_000_000);
        assert_eq!(b.available(0, 5), 5);
    }
}
