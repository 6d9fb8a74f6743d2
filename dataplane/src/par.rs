//! [`par_map`]: an index-ordered map over `0..n` on a few scoped threads, for the control
//! thread's table builds (Maglev tables, Service layouts) and translations. Not used per
//! packet: it starts threads.

use std::sync::atomic::{AtomicUsize, Ordering};

/// `(0..n).map(|i| f(&mut state, i))` on up to `threads` threads (scoped; the calling thread
/// is one of them), in index order, and the number of threads that took part (≥ 1).
///
/// Each thread makes its own `state` with `init` (scratch memory such as a Maglev bitmap) and
/// claims `per_claim` consecutive indices at a time from a shared counter, so a thread the
/// machine slows down takes fewer. A helper that cannot be started, or that panicked, leaves
/// its indices to the calling thread, so the result is always complete; for an `f` whose
/// result depends only on `i` it is the one-thread result whatever `threads`. `threads` ≤ 1
/// (or `n` ≤ `per_claim`) runs on the calling thread alone and starts nothing. `name` names
/// the helper threads (as `ps` and `perf` show them).
pub fn par_map<S, T: Send>(
    n: usize,
    threads: usize,
    per_claim: usize,
    name: &str,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize) -> T + Sync,
) -> (Vec<T>, usize) {
    let per_claim = per_claim.max(1);
    let threads = threads.min(n.div_ceil(per_claim)).max(1);
    let mut state = init();
    if threads == 1 {
        return ((0..n).map(|i| f(&mut state, i)).collect(), 1);
    }
    let next = AtomicUsize::new(0);
    // Claims the next run of indices and maps it; (index, result) pairs.
    let work = |state: &mut S| {
        let mut out = Vec::new();
        loop {
            let from = next.fetch_add(per_claim, Ordering::Relaxed);
            if from >= n {
                break;
            }
            out.extend((from..n.min(from + per_claim)).map(|i| (i, f(state, i))));
        }
        out
    };
    let mut results: Vec<Option<T>> = std::iter::repeat_with(|| None).take(n).collect();
    let mut used = 1;
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads)
            .filter_map(|_| std::thread::Builder::new().name(name.into()).spawn_scoped(s, || work(&mut init())).ok())
            .collect();
        used += helpers.len();
        let mine = work(&mut state);
        for (i, r) in helpers.into_iter().filter_map(|h| h.join().ok()).flatten().chain(mine) {
            if let Some(slot) = results.get_mut(i) {
                *slot = Some(r);
            }
        }
    });
    // Indices of a helper that panicked: mapped here, in order.
    (results.into_iter().enumerate().map(|(i, r)| r.unwrap_or_else(|| f(&mut state, i))).collect(), used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Mutex;

    #[test]
    fn par_map_keeps_index_order_and_uses_several_threads() {
        let ids = Mutex::new(HashSet::new());
        let (out, used) = par_map(
            1000,
            2,
            8,
            "par-test",
            || (),
            |(), i| {
                if let Ok(mut s) = ids.lock() {
                    s.insert(std::thread::current().id());
                }
                // Enough work per index that one thread cannot take every claim before the
                // other starts.
                std::thread::sleep(std::time::Duration::from_micros(50));
                i * 3
            },
        );
        assert_eq!(out, (0..1000).map(|i| i * 3).collect::<Vec<_>>());
        assert_eq!(used, 2);
        assert_eq!(ids.lock().map(|s| s.len()).unwrap_or(0), 2, "both threads mapped indices");
    }

    #[test]
    fn par_map_runs_alone_for_one_thread_or_one_claim() {
        let main = std::thread::current().id();
        for (n, threads) in [(100, 1), (8, 4), (0, 4)] {
            let (out, used) = par_map(n, threads, 8, "par-test", || (), |(), i| (i, std::thread::current().id()));
            assert_eq!(used, 1, "n {n} threads {threads}");
            assert!(out.iter().enumerate().all(|(k, &(i, id))| k == i && id == main));
        }
    }

    #[test]
    fn par_map_gives_each_thread_its_own_state() {
        // The state counts the indices its thread mapped: every result is at least 1 and the
        // counts of the threads add up to n.
        let (out, used) = par_map(
            512,
            2,
            4,
            "par-test",
            || 0usize,
            |seen, _| {
                *seen += 1;
                std::thread::sleep(std::time::Duration::from_micros(20));
                *seen
            },
        );
        assert_eq!(used, 2);
        assert!(out.iter().all(|&c| c >= 1));
        // Each thread's counts run 1, 2, 3, …: the number of 1s is the number of threads.
        assert_eq!(out.iter().filter(|&&c| c == 1).count(), 2);
    }

    #[test]
    fn par_map_maps_a_panicking_helpers_indices_on_the_calling_thread() {
        let main = std::thread::current().id();
        let refused = std::sync::atomic::AtomicBool::new(false);
        let (out, _) = par_map(
            256,
            2,
            4,
            "par-test",
            || (),
            |(), i| {
                if std::thread::current().id() != main && i % 2 == 1 {
                    refused.store(true, Ordering::Relaxed);
                    panic!("the helper refuses odd indices");
                }
                std::thread::sleep(std::time::Duration::from_micros(20));
                i
            },
        );
        assert!(refused.load(Ordering::Relaxed), "the helper claimed indices and panicked");
        assert_eq!(out, (0..256).collect::<Vec<_>>());
    }
}
