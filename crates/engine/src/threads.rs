//! The compute threads: one pool, sized once before the model runs, that every forward
//! step's parallel work (matrix multiplications, attention) shares.

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
