//! Client-side rate limit of xlb's Kubernetes API client, as client-go's: kube-proxy's
//! `clientConnection.qps` and `clientConnection.burst`.
//!
//! client-go (`k8s.io/client-go/rest`, `Config.QPS`, `Config.Burst`; the generated clientset's
//! `NewForConfigAndClient`) makes one token bucket per client,
//! `flowcontrol.NewTokenBucketRateLimiter(qps, burst)` (golang.org/x/time/rate: `burst`
//! tokens, full at the start, refilled at `qps` per second), and every request waits for one
//! token before it is sent (`Request.tryThrottle`). A watch is one request: its token is
//! taken when the watch is opened, and the events it streams afterwards cost nothing.
//!
//! [`RateLimitLayer`] does the same as a tower layer under [`kube::Client`]: the service it
//! wraps takes one token in `poll_ready` per HTTP request (a watch's response body streams
//! without further tokens), with `governor`'s GCRA, which is a token bucket of `burst` cells
//! refilled one cell per `1/qps` seconds. kube's client puts its own `Buffer` in front of the
//! stack, so requests queue for tokens one after the other (first come, first served), as they
//! do behind client-go's `Wait`. Every clone of a [`kube::Client`] shares the one bucket, as
//! every client of a client-go clientset does.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, Quota};

use crate::config::ClientConnectionConfig;

/// client-go's `rest.DefaultQPS`: what `qps: 0` means (kube-proxy's defaulting,
/// `SetDefaults_KubeProxyConfiguration`, turns 0 into it too). Requests per second.
pub const DEFAULT_QPS: f32 = 5.0;
/// client-go's `rest.DefaultBurst`: what `burst: 0` means. Requests.
pub const DEFAULT_BURST: i32 = 10;

/// A token bucket: `burst` requests at once, then `qps` requests per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Tokens added per second (> 0, finite).
    pub qps: f64,
    /// Bucket size, requests (≥ 1); the bucket starts full.
    pub burst: NonZeroU32,
}

/// The longest time between two tokens: one a day (a smaller `qps` is taken as that).
pub(crate) const LONGEST_PERIOD: Duration = Duration::from_secs(86_400);

/// A `clientConnection` that client-go would refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RateLimitError {
    /// `qps` is NaN or infinite.
    #[error("clientConnection.qps {0}: want a finite number")]
    Qps(f32),
    /// `burst` is negative (kube-proxy's validation: `ValidateNonnegativeField(Burst)`).
    #[error("clientConnection.burst {0}: must be non-negative")]
    Burst(i32),
}

impl RateLimit {
    /// The limit of a `clientConnection` block, with client-go's meaning (`rest.Config`):
    /// `qps` 0 is [`DEFAULT_QPS`], `burst` 0 is [`DEFAULT_BURST`], a negative `qps` turns
    /// client-side rate limiting off (`None`).
    ///
    /// # Errors
    /// [`RateLimitError::Qps`] for a NaN or infinite `qps`, [`RateLimitError::Burst`] for a
    /// negative `burst`.
    pub fn from_client_connection(c: &ClientConnectionConfig) -> Result<Option<Self>, RateLimitError> {
        if !c.qps.is_finite() {
            return Err(RateLimitError::Qps(c.qps));
        }
        let qps = if c.qps == 0.0 { DEFAULT_QPS } else { c.qps };
        let burst = match c.burst {
            0 => DEFAULT_BURST,
            b if b < 0 => return Err(RateLimitError::Burst(b)),
            b => b,
        };
        if qps < 0.0 {
            return Ok(None);
        }
        let burst = NonZeroU32::new(burst.unsigned_abs()).ok_or(RateLimitError::Burst(burst))?;
        Ok(Some(Self { qps: f64::from(qps), burst }))
    }

    /// The time between two tokens: at least 1 ns, at most [`LONGEST_PERIOD`] (a `qps` that
    /// small, which the config accepts, would overflow a `Duration` or the limiter's 64-bit
    /// nanoseconds).
    fn period(self) -> Duration {
        Duration::try_from_secs_f64(1.0 / self.qps)
            .unwrap_or(LONGEST_PERIOD)
            .clamp(Duration::from_nanos(1), LONGEST_PERIOD)
    }
}

/// Tower layer that rate limits the wrapped service with one shared token bucket (see the
/// module docs). Services made from one layer (and their clones) share its bucket.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimitLayer {
    /// A layer with a fresh, full bucket.
    pub fn new(limit: RateLimit) -> Self {
        let quota = Quota::with_period(limit.period()).map(|q| q.allow_burst(limit.burst));
        // `period` is at least 1 ns, so `with_period` always gives a quota.
        let quota = quota.unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX).allow_burst(limit.burst));
        Self { limiter: Arc::new(DefaultDirectRateLimiter::direct(quota)) }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService { inner, limiter: self.limiter.clone(), permit: false, wait: None }
    }
}

/// The service of [`RateLimitLayer`]: `poll_ready` is pending until the bucket has a token,
/// takes it, then asks the inner service; `call` spends it.
pub struct RateLimitService<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    /// A token was taken for the next `call`.
    permit: bool,
    /// Waiting for the next token.
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> std::fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitService").field("permit", &self.permit).finish_non_exhaustive()
    }
}

impl<S: Clone> Clone for RateLimitService<S> {
    /// A clone shares the bucket and holds no token of its own.
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), limiter: self.limiter.clone(), permit: false, wait: None }
    }
}

impl<S, R> tower::Service<R> for RateLimitService<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.permit {
            if let Some(wait) = &mut self.wait {
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
            }
            match self.limiter.check() {
                Ok(()) => self.permit = true,
                Err(not_until) => {
                    let d = not_until.wait_time_from(self.limiter.clock().now());
                    self.wait = Some(Box::pin(tokio::time::sleep(d)));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.permit = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(qps: f32, burst: i32) -> ClientConnectionConfig {
        ClientConnectionConfig { qps, burst }
    }

    #[test]
    fn client_gos_zero_and_negative_values() {
        let five_ten = RateLimit { qps: 5.0, burst: NonZeroU32::new(10).unwrap() };
        assert_eq!(RateLimit::from_client_connection(&cc(0.0, 0)), Ok(Some(five_ten)));
        assert_eq!(RateLimit::from_client_connection(&ClientConnectionConfig::default()), Ok(Some(five_ten)));
        let l = RateLimit::from_client_connection(&cc(0.5, 3)).unwrap().unwrap();
        assert_eq!((l.qps, l.burst.get()), (0.5, 3));
        assert_eq!(l.period(), Duration::from_secs(2));
        assert_eq!(RateLimit::from_client_connection(&cc(-1.0, 0)), Ok(None));
        assert_eq!(RateLimit::from_client_connection(&cc(20.0, -1)), Err(RateLimitError::Burst(-1)));
        assert_eq!(RateLimit::from_client_connection(&cc(f32::INFINITY, 1)), Err(RateLimitError::Qps(f32::INFINITY)));
    }

    #[test]
    fn a_tiny_qps_that_the_config_accepts_does_not_panic_when_the_layer_is_built() {
        for qps in [1e-30, f32::MIN_POSITIVE, 1e-6] {
            let l = RateLimit::from_client_connection(&cc(qps, 1)).unwrap().unwrap();
            assert_eq!(l.period(), LONGEST_PERIOD, "qps {qps}");
            let r = std::panic::catch_unwind(|| RateLimitLayer::new(l));
            assert!(r.is_ok(), "RateLimitLayer::new panicked for qps {qps}");
        }
    }
}
