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

/// Runs `op` (a forward step, or a step's sampling) on the compute pool with every other
/// pool thread kept awake until it returns, and returns its result. `op` may run parallel
/// iterators: the spinning jobs are the oldest in the owner's queue, which other threads
/// take first, so every spinner is running before any of `op`'s own jobs can be taken,
/// and a thread waiting inside one of those never picks up a spinner.
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
                // The op's own thread must never wait here for the op's end: it may run
                // this job while it waits for another, and the op would never end.
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

/// Runs `task(i, row)` for every `width`-wide row of `out` on the compute pool (rayon's
/// work stealing over the rows): the large, even loops of an image's encoding, where the
/// step loop's finer-grained [`for_each_index`] buys nothing.
pub fn for_each_rows(out: &mut [f32], width: usize, task: impl Fn(usize, &mut [f32]) + Sync) {
    use rayon::prelude::*;
    out.par_chunks_mut(width.max(1))
        .enumerate()
        .for_each(|(i, row)| task(i, row));
}

/// Runs `task(i)` for every `i` in `0..n` on the compute pool and returns when all have
/// run. A panicking task's panic is passed on once the others have run; where the pool
/// has one thread (or there is one index) the tasks run in order on the caller, and a
/// panic stops them there.
///
/// Each pool thread starts on its own contiguous share of the indices and takes them front
/// to back, so that the weights a thread reads are one stream for the hardware prefetchers;
/// a thread whose share is done takes the others' remaining indices from the back. The
/// calling thread waits for the last index by spinning (for up to [`SPIN_LIMIT`]; then
/// the rayon scope's own wait takes over). A rayon `join` or parallel
/// iterator waits for a stolen half by parking the waiting thread after a few rounds of
/// `sched_yield`, and the half's end then pays a futex wake: a 1B model's decode step (65
/// products of 1–80 MB each) spent 4–6% of its two threads' time between a product's last
/// task and the return of its parallel iterator, most in the products that take longest.
pub fn for_each_index(n: usize, task: impl Fn(usize) + Sync) {
    let threads = rayon::current_num_threads().min(n);
    if threads <= 1 || n > Share::MAX_END {
        (0..n).for_each(task);
        return;
    }
    let shares: Vec<Share> = (0..threads)
        .map(|t| Share::new(split(n, threads, t)..split(n, threads, t + 1)))
        .collect();
    let done = Counter(AtomicUsize::new(0));
    let run = |i: usize| {
        // Counted when it returns or unwinds, so that a helper's panic does not hold the
        // wait below to its limit.
        let _count = CountOnDrop(&done.0);
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
        // Every index is taken: spin while the other threads finish theirs. Past the
        // limit (a helper preempted mid-task, or a prompt's long tasks) the scope's wait
        // for its jobs takes over, which parks this thread rather than burn the core.
        let start = std::time::Instant::now();
        while done.0.load(Ordering::Acquire) < n && start.elapsed() < SPIN_LIMIT {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
    });
}

/// How long [`for_each_index`]'s caller spins for the other threads' last tasks: longer
/// than the tail of a decode step's product (a task of a 1B model's widest matrix takes
/// about 50 µs), short enough that a preempted helper costs little of the core.
pub const SPIN_LIMIT: std::time::Duration = std::time::Duration::from_micros(200);

/// The first of thread `t`'s indices when `n` are split evenly between `threads`.
fn split(n: usize, threads: usize, t: usize) -> usize {
    (t as u64 * n as u64 / threads as u64) as usize
}

/// A counter on a cache line of its own (the shares' headers, which every take reads, stay
/// clean when a task ends).
#[repr(align(128))]
struct Counter(AtomicUsize);

/// One thread's share of [`for_each_index`]'s indices: the untaken range `front..back`,
/// packed in one word (`front` in the low half) so that its owner taking from the front
/// and another thread taking from the back never both take the last index. On a cache
/// line of its own, as its owner changes it at every task.
#[repr(align(128))]
struct Share(AtomicU64);

impl Share {
    /// The largest end of a share's range (indices are below it).
    const MAX_END: usize = u32::MAX as usize;

    /// A share of `range`.
    fn new(range: std::ops::Range<usize>) -> Self {
        Share(AtomicU64::new(Self::pack(range.start, range.end)))
    }

    /// The word holding the range `front..back`.
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

    /// A pool of two threads of its own, so that tasks run on both whatever the machine's
    /// cores and the global pool's size.
    fn two_threads() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
    }

    /// Waits (up to ten seconds) until `flag` is set.
    fn wait_for(flag: &AtomicBool) {
        let start = std::time::Instant::now();
        while !flag.load(Ordering::Acquire) && start.elapsed().as_secs() < 10 {
            std::thread::yield_now();
        }
    }

    /// Runs `for_each_index(n, …)` on a two-thread pool and returns how many times each
    /// index ran and whether a thread other than the caller ran any. The caller's tasks
    /// wait until the other thread has run one, so that both take part even on one core.
    fn runs_per_index_on_two_threads(n: usize) -> (Vec<usize>, bool) {
        let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        let helped = AtomicBool::new(false);
        two_threads().install(|| {
            let caller = rayon::current_thread_index();
            for_each_index(n, |i| {
                if rayon::current_thread_index() == caller {
                    if n >= 2 {
                        wait_for(&helped);
                    }
                } else {
                    helped.store(true, Ordering::Release);
                }
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
        });
        let counts = counts.into_iter().map(AtomicUsize::into_inner).collect();
        (counts, helped.into_inner())
    }

    /// Every index runs exactly once, with both threads taking part (shares taken from
    /// the front and from the back), called from a step and from within another call's
    /// tasks too.
    #[test]
    fn every_index_runs_exactly_once() {
        for n in [0, 1, 2, 3, 7, 64, 1000] {
            let (counts, helped) = runs_per_index_on_two_threads(n);
            assert!(counts.iter().all(|&c| c == 1), "{n} indices: {counts:?}");
            assert_eq!(helped, n >= 2, "{n} indices");
        }
        let in_step: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        with_threads_awake(|| {
            for_each_index(100, |i| {
                in_step[i].fetch_add(1, Ordering::Relaxed);
            })
        });
        assert!(in_step.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        let nested: Vec<AtomicUsize> = (0..8 * 50).map(|_| AtomicUsize::new(0)).collect();
        two_threads().install(|| {
            for_each_index(8, |outer| {
                for_each_index(50, |inner| {
                    nested[outer * 50 + inner].fetch_add(1, Ordering::Relaxed);
                });
            })
        });
        assert!(nested.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }

    /// An index is taken once even when a share's owner (from the front) and another
    /// thread (from the back) race for its last ones: many small shares, both threads
    /// released together.
    #[test]
    fn a_share_gives_each_index_once_from_either_end() {
        for _ in 0..300 {
            let share = Share::new(10..74);
            let start = std::sync::Barrier::new(2);
            let drain = |take: fn(&Share) -> Option<usize>| {
                start.wait();
                std::iter::from_fn(|| take(&share)).collect::<Vec<_>>()
            };
            let (front, back) = std::thread::scope(|s| {
                let drain = &drain;
                let front = s.spawn(move || drain(Share::take_front));
                let back = s.spawn(move || drain(Share::take_back));
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
            assert_eq!(all, (10..74).collect::<Vec<_>>());
            assert_eq!(share.take_front(), None);
            assert_eq!(share.take_back(), None);
        }
    }

    /// A task panicking on the other thread reaches the caller once every other task has
    /// run, the rest of the panicking thread's share taken by the caller.
    #[test]
    fn a_panicking_task_reaches_the_caller() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ran = AtomicUsize::new(0);
            let helper_started = AtomicBool::new(false);
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                two_threads().install(|| {
                    let caller = rayon::current_thread_index();
                    // Two shares: 0..20 the caller's, 20..40 the other thread's.
                    for_each_index(40, |i| {
                        ran.fetch_add(1, Ordering::Relaxed);
                        if rayon::current_thread_index() == caller {
                            wait_for(&helper_started);
                        } else {
                            helper_started.store(true, Ordering::Release);
                            assert_ne!(i, 20, "the other thread's first task fails");
                        }
                    })
                })
            }));
            tx.send((caught.is_err(), ran.into_inner())).unwrap();
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(30));
        let (panicked, ran) = got.expect("the call never returned");
        assert!(panicked, "the panic was lost");
        assert_eq!(ran, 40, "a task was skipped");
    }
}
