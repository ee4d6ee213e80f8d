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
        // Set on the way out, a panic's included: the scope waits for the spinning jobs.
        let _release = SetOnDrop(&done);
        op()
    })
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
}
