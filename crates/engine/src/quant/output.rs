//! A product's `n × rows` output written in place by parallel tasks, each of which owns a
//! range of output features (columns) for every activation row, so that no task needs a
//! buffer of its own to be copied afterwards. The output is one row-major matrix or one
//! vector per activation row (the logits rows the sampler takes, which would otherwise be
//! copied out of the matrix on the step's own thread while the other threads wait).

use std::marker::PhantomData;
use std::ops::Range;

/// A product's output (one matrix, or one vector per activation row) lent to tasks that
/// each write a disjoint range of columns of every row.
pub struct Output<'a> {
    /// Where each activation row's `rows` values start.
    starts: Vec<*mut f32>,
    rows: usize,
    _out: PhantomData<&'a mut [f32]>,
}

// SAFETY: tasks only write through `Columns`, whose ranges never overlap (see `columns`).
unsafe impl Send for Output<'_> {}
// SAFETY: tasks only write through `Columns`, whose ranges never overlap (see `columns`).
unsafe impl Sync for Output<'_> {}

impl<'a> Output<'a> {
    /// Lends `out`, an `n × rows` matrix.
    pub fn new(out: &'a mut [f32], n: usize, rows: usize) -> Self {
        assert_eq!(Some(out.len()), n.checked_mul(rows));
        Self::matrix(out.as_mut_ptr(), n, rows)
    }

    /// Lends the spare capacity of `out` (empty, with room for at least `n · rows`
    /// values) as an `n × rows` matrix. Once every task has written its columns
    /// ([`Columns::zero`] first, then its results), [`fill`] gives `out` its length.
    pub fn spare(out: &'a mut Vec<f32>, n: usize, rows: usize) -> Self {
        let len = n.checked_mul(rows).expect("the output's size fits a usize");
        assert!(out.is_empty() && out.capacity() >= len);
        Self::matrix(out.spare_capacity_mut().as_mut_ptr() as *mut f32, n, rows)
    }

    /// The `n × rows` row-major matrix at `base`, which its callers have checked holds
    /// `n · rows` values.
    fn matrix(base: *mut f32, n: usize, rows: usize) -> Self {
        Self {
            // SAFETY: row `t` starts inside the allocation (or at its end, for an empty
            // row), as the callers checked.
            starts: (0..n).map(|t| unsafe { base.add(t * rows) }).collect(),
            rows,
            _out: PhantomData,
        }
    }

    /// Lends the spare capacity of each vector of `out` (empty, with room for at least
    /// `rows` values) as one activation row's output, as [`Output::spare`] does.
    pub fn spare_rows(out: &'a mut [Vec<f32>], rows: usize) -> Self {
        assert!(out
            .iter()
            .all(|row| row.is_empty() && row.capacity() >= rows));
        Self {
            starts: out
                .iter_mut()
                .map(|row| row.spare_capacity_mut().as_mut_ptr() as *mut f32)
                .collect(),
            rows,
            _out: PhantomData,
        }
    }

    /// Columns `range` of every row, for one task to write.
    ///
    /// # Safety
    /// No two `Columns` of the same output with overlapping ranges may exist at once.
    pub unsafe fn columns(&self, range: Range<usize>) -> Columns<'_> {
        assert!(range.start <= range.end && range.end <= self.rows);
        Columns {
            output: self,
            range,
        }
    }
}

/// Gives `out`, lent by [`Output::spare`] for `len` values (or as one of the vectors of
/// [`Output::spare_rows`], `len` being its row's width), its length.
///
/// # Safety
/// Every one of the `len` values must have been written: each column of each row by the
/// task whose [`Columns`] held it.
pub unsafe fn fill(out: &mut Vec<f32>, len: usize) {
    assert!(out.capacity() >= len);
    // SAFETY: in capacity (checked), and written, as the caller promises.
    unsafe { out.set_len(len) };
}

/// One task's columns of an [`Output`].
pub struct Columns<'a> {
    output: &'a Output<'a>,
    range: Range<usize>,
}

impl Columns<'_> {
    /// Writes zero in every one of this task's columns, for every activation row: what a
    /// kernel that leaves some of them alone finds there.
    pub fn zero(&self) {
        for &start in &self.output.starts {
            // SAFETY: the columns are in bounds (checked when lent), and no other task
            // writes them.
            unsafe {
                std::ptr::write_bytes(start.add(self.range.start), 0, self.range.len());
            }
        }
    }

    /// Writes `v` at activation row `t`, output feature `r` (which must be this task's).
    #[inline]
    pub fn set(&self, t: usize, r: usize, v: f32) {
        assert!(t < self.output.starts.len() && self.range.contains(&r));
        // SAFETY: in bounds (checked), and no other task writes this column.
        unsafe { *self.output.starts[t].add(r) = v };
    }

    /// Writes `values` at activation row `t` from output feature `r` on, leaving out
    /// those past this task's columns (`r` must be one of them).
    #[inline]
    pub fn set_run(&self, t: usize, r: usize, values: &[f32]) {
        assert!(t < self.output.starts.len() && self.range.contains(&r));
        let len = values.len().min(self.range.end - r);
        // SAFETY: in bounds (checked), and no other task writes these columns.
        unsafe {
            let to = self.output.starts[t].add(r);
            std::ptr::copy_nonoverlapping(values.as_ptr(), to, len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn tasks_fill_their_columns() {
        let (n, rows) = (3, 10);
        let mut out = vec![0f32; n * rows];
        let output = Output::new(&mut out, n, rows);
        (0..rows / 2).into_par_iter().for_each(|c| {
            // SAFETY: each task takes two columns of its own.
            let cols = unsafe { output.columns(2 * c..2 * c + 2) };
            for t in 0..n {
                for r in 2 * c..2 * c + 2 {
                    cols.set(t, r, (t * 100 + r) as f32);
                }
            }
        });
        let want: Vec<f32> = (0..n * rows)
            .map(|i| ((i / rows) * 100 + i % rows) as f32)
            .collect();
        assert_eq!(out, want);
    }

    #[test]
    fn a_run_stops_at_the_end_of_the_columns() {
        let mut out = vec![0f32; 2 * 6];
        let output = Output::new(&mut out, 2, 6);
        // SAFETY: the only columns.
        let cols = unsafe { output.columns(1..4) };
        cols.set_run(1, 2, &[7.0, 8.0, 9.0, 10.0]);
        assert_eq!(out, [0., 0., 0., 0., 0., 0., 0., 0., 7., 8., 0., 0.]);
    }

    #[test]
    fn spare_rows_are_written_by_their_tasks() {
        let (n, rows) = (3, 10);
        let mut out: Vec<Vec<f32>> = (0..n).map(|_| Vec::with_capacity(rows)).collect();
        let output = Output::spare_rows(&mut out, rows);
        (0..rows / 2).into_par_iter().for_each(|c| {
            // SAFETY: each task takes two columns of its own.
            let cols = unsafe { output.columns(2 * c..2 * c + 2) };
            cols.zero();
            // Column 2c + 1 is left as zeroed.
            cols.set(c % n, 2 * c, (c + 1) as f32);
        });
        drop(output);
        for row in &mut out {
            // SAFETY: every column of every row was zeroed by its task.
            unsafe { fill(row, rows) };
        }
        for (t, row) in out.iter().enumerate() {
            let want: Vec<f32> = (0..rows)
                .map(|r| match r % 2 == 0 && (r / 2) % n == t {
                    true => (r / 2 + 1) as f32,
                    false => 0.0,
                })
                .collect();
            assert_eq!(row, &want);
        }
    }

    #[test]
    fn a_spare_matrix_is_row_major() {
        let (n, rows) = (2, 4);
        let mut out = Vec::with_capacity(n * rows);
        let output = Output::spare(&mut out, n, rows);
        // SAFETY: the only columns.
        let cols = unsafe { output.columns(0..rows) };
        cols.zero();
        cols.set_run(1, 1, &[5.0, 6.0]);
        drop(output);
        // SAFETY: every column was zeroed.
        unsafe { fill(&mut out, n * rows) };
        assert_eq!(out, [0., 0., 0., 0., 0., 5., 6., 0.]);
    }

    #[test]
    #[should_panic]
    fn a_column_outside_the_range_is_refused() {
        let mut out = vec![0f32; 4];
        let output = Output::new(&mut out, 1, 4);
        // SAFETY: the only columns.
        let cols = unsafe { output.columns(0..2) };
        cols.set(0, 2, 1.0);
    }
}
