//! The compute threads: one pool, sized once before the model runs, that every forward
//! step's parallel work (matrix multiplications, attention) shares.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Cores this process may run on: the CPU affinity mask and the cgroup CPU quota
/// (`cpu.max`, or v1's `cfs_quota_us`) are both taken into account, which is what a
/// container or `taskset` gives it, not the host's count.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Sizes the compute pool to `threads` (at least 1). Call it once, before the first
/// forward step; a second call keeps the first size and says so.
pub fn set_compute_threads(threads: usize) -> Result<(), String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("ferrite-compute-{i}"))
        .build_global()
        .map_err(|e| format!("the compute pool is already running: {e}"))
}

/// Threads the compute pool runs.
pub fn compute_threads() -> usize {
    rayon::current_num_threads()
}

/// Runs `op` (a forward step) on the compute pool with every other pool thread kept awake
/// until it returns, and returns its result.
///
/// A step is a hundred or so short parallel regions (a matrix product each, a few
/// milliseconds or less in decode) with a little serial work between them. Rayon parks an
/// idle thread after a few rounds of `sched_yield` and wakes it with a futex when work
/// arrives, so each region paid a park and a wake: about 5% of a 1B model's decode step in
/// the kernel's scheduler. Here each other thread runs a job that takes pending work
/// as soon as it appears and otherwise spins, as llama.cpp's threads spin between the
/// nodes of a graph; the job returns when `op` has.
pub fn with_threads_awake<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    rayon::scope(|scope| {
        let owner = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            let done = &done;
            scope.spawn(move |_| {
                // The step's own thread must never wait here for the step's end: it may
                // run this job while it waits for another, and the step would never end.
                if rayon::current_thread_index() == owner {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        // Set on the way out, a panic's included: the scope waits for the spinning jobs.
        let _release = SetOnDrop(&done);
        op()
    })
}

/// Runs `task(i)` for every `i` in `0..n` on the compute pool and returns when all have
/// run (a panicking task's panic is passed on once the others have run).
///
/// Each pool thread starts on its own contiguous share of the indices and takes them front
/// to back, so that the weights a thread reads are one stream for the hardware prefetchers;
/// a thread whose share is done takes the others' remaining indices from the back. The
/// calling thread waits for the last index by spinning. A rayon `join` or parallel
/// iterator waits for a stolen half by parking the waiting thread after a few rounds of
/// `sched_yield`, and the half's end then pays a futex wake: a 1B model's decode step (65
/// products of 1–80 MB each) spent 4–6% of its two threads' time between a product's last
/// task and the return of its parallel iterator, most in the products that take longest.
pub fn for_each_index(n: usize, task: impl Fn(usize) + Sync) {
    let threads = rayon::current_num_threads().min(n);
    if threads <= 1 || n > Share::MAX_INDEX {
        (0..n).for_each(task);
        return;
    }
    let shares: Vec<Share> = (0..threads)
        .map(|t| Share::new(t * n / threads..(t + 1) * n / threads))
        .collect();
    let done = AtomicUsize::new(0);
    let run = |i: usize| {
        // Counted when it returns or unwinds, so that the wait below always ends.
        let _count = CountOnDrop(&done);
        task(i);
    };
    let work = |first: usize| {
        while let Some(i) = shares[first].take_front() {
            run(i);
        }
        for other in (1..threads).map(|k| (first + k) % threads) {
            while let Some(i) = shares[other].take_back() {
                run(i);
            }
        }
    };
    rayon::scope(|scope| {
        for t in 1..threads {
            let work = &work;
            scope.spawn(move |_| work(t));
        }
        work(0);
        // Every index is taken; wait for the ones other threads still run.
        let mut spins = 0u32;
        while done.load(Ordering::Acquire) < n {
            if spins < SPINS_BEFORE_YIELDING {
                spins += 1;
                std::hint::spin_loop();
            } else {
                // A thread preempted mid-task: let it have the core.
                std::thread::yield_now();
            }
        }
    });
}

/// Spins of [`for_each_index`]'s wait before it yields the core to each look (tens of
/// microseconds, longer than a task's tail in a step's product).
const SPINS_BEFORE_YIELDING: u32 = 1 << 14;

/// One thread's share of [`for_each_index`]'s indices: the untaken range `front..back`,
/// packed in one word (`front` in the low half) so that its owner taking from the front
/// and another thread taking from the back never both take the last index. On a cache
/// line of its own, as its owner changes it at every task.
#[repr(align(128))]
struct Share(AtomicU64);

impl Share {
    /// The largest index a share can hold.
    const MAX_INDEX: usize = u32::MAX as usize;

    /// A share of `range`.
    fn new(range: std::ops::Range<usize>) -> Self {
        Share(AtomicU64::new(Self::pack(range.start, range.end)))
    }

    fn pack(front: usize, back: usize) -> u64 {
        front as u64 | (back as u64) << 32
    }

    /// Takes the first untaken index, if any.
    fn take_front(&self) -> Option<usize> {
        self.take(|front, back| (front, Self::pack(front + 1, back)))
    }

    /// Takes the last untaken index, if any.
    fn take_back(&self) -> Option<usize> {
        self.take(|front, back| (back - 1, Self::pack(front, back - 1)))
    }

    /// Takes the index `pick` names from a non-empty range, with the range left after it.
    fn take(&self, pick: impl Fn(usize, usize) -> (usize, u64)) -> Option<usize> {
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            let (front, back) = ((word & u32::MAX as u64) as usize, (word >> 32) as usize);
            if front >= back {
                return None;
            }
            let (index, rest) = pick(front, back);
            match self
                .0
                .compare_exchange_weak(word, rest, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(index),
                Err(now) => word = now,
            }
        }
    }
}

/// Adds one to its counter when dropped.
struct CountOnDrop<'a>(&'a AtomicUsize);

impl Drop for CountOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic in the step reaches the caller rather than leaving the pool's other
    /// threads spinning and the scope waiting for them.
    #[test]
    fn a_panicking_step_releases_the_other_threads() {
        // On another thread, so that a hang fails the test rather than stalling it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let caught = std::panic::catch_unwind(|| with_threads_awake(|| panic!("step failed")));
            tx.send(caught.is_err()).unwrap();
        });
        let caught = rx.recv_timeout(std::time::Duration::from_secs(20));
        assert_eq!(caught, Ok(true), "the step's panic never came back");
        // The pool still runs steps.
        let sum = with_threads_awake(|| {
            use rayon::prelude::*;
            (0..100u32).into_par_iter().sum::<u32>()
        });
        assert_eq!(sum, 4950);
    }

    /// Runs `for_each_index(n, …)` and returns how many times each index ran.
    fn runs_per_index(n: usize) -> Vec<usize> {
        let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        for_each_index(n, |i| {
            counts[i].fetch_add(1, Ordering::Relaxed);
        });
        counts.into_iter().map(AtomicUsize::into_inner).collect()
    }

    /// Every index runs exactly once, whatever the count of indices against threads,
    /// called from outside the pool, from a step and from within another call's task.
    #[test]
    fn every_index_runs_exactly_once() {
        for n in [0, 1, 2, 3, 7, 64, 1000] {
            assert!(runs_per_index(n).iter().all(|&c| c == 1), "{n} indices");
            let in_step = with_threads_awake(|| runs_per_index(n));
            assert!(in_step.iter().all(|&c| c == 1), "{n} indices in a step");
        }
        let nested: Vec<AtomicUsize> = (0..8 * 50).map(|_| AtomicUsize::new(0)).collect();
        for_each_index(8, |outer| {
            for_each_index(50, |inner| {
                nested[outer * 50 + inner].fetch_add(1, Ordering::Relaxed);
            });
        });
        assert!(nested.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }

    /// An index is taken once even when its share's owner (from the front) and another
    /// thread (from the back) race for the last ones.
    #[test]
    fn a_share_gives_each_index_once_from_either_end() {
        let share = Share::new(10..1010);
        let (front, back) = std::thread::scope(|s| {
            let front = s.spawn(|| std::iter::from_fn(|| share.take_front()).collect::<Vec<_>>());
            let back = s.spawn(|| std::iter::from_fn(|| share.take_back()).collect::<Vec<_>>());
            (front.join().unwrap(), back.join().unwrap())
        });
        assert!(
            front.windows(2).all(|w| w[0] < w[1]),
            "the front goes forward"
        );
        assert!(
            back.windows(2).all(|w| w[0] > w[1]),
            "the back goes backward"
        );
        let mut all: Vec<usize> = front.into_iter().chain(back).collect();
        all.sort_unstable();
        assert_eq!(all, (10..1010).collect::<Vec<_>>());
        assert_eq!(share.take_front(), None);
        assert_eq!(share.take_back(), None);
    }

    /// A panicking task's panic reaches the caller once the other tasks have run, rather
    /// than leaving the caller waiting for a count that never completes.
    #[test]
    fn a_panicking_task_reaches_the_caller() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ran = AtomicUsize::new(0);
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for_each_index(40, |i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    assert_ne!(i, 17, "task 17 fails");
                })
            }));
            tx.send((caught.is_err(), ran.into_inner())).unwrap();
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(20));
        // Rayon passes on the first panic; the tasks after it on other threads still ran.
        let (panicked, ran) = got.expect("the call never returned");
        assert!(panicked);
        assert!(ran >= 18, "only {ran} tasks ran");
    }
}
