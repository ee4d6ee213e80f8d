//! The compute threads: one pool, sized once before the model runs, that every forward
//! step's parallel work (matrix multiplications, attention) shares.

use std::sync::atomic::{AtomicBool, Ordering};

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
        let out = op();
        done.store(true, Ordering::Release);
        out
    })
}
