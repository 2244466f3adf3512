//! Single-precision matrix products for the actors' forward passes, with the weight
//! operand packed once per parameter version and no allocation per call.
//!
//! Two shapes cover every layer:
//! - a dense layer, `out[m, n] += x[m, k] · W[k, n]`, with `W` packed in panels of
//!   [`NR`] columns ([`PackedCols`]);
//! - a convolution after im2col, `out[m, n] += W[m, k] · cols[k, n]`, with `W` packed in
//!   panels of [`MR`] rows ([`PackedRows`]).
//!
//! **The same bits as `matrixmultiply` 0.3**, which the actors used before (and the
//! tests compare against): each output adds its products in order of `k`, in blocks of
//! [`KC`] = 256 summed from zero and then added to `out` block by block, with a fused
//! multiply-add where `matrixmultiply` picks a fused kernel (x86 with AVX2 and FMA,
//! AArch64) and a multiply then an add elsewhere. So switching changed no action and no
//! learning curve: lock-step runs stay bit-identical across the change.
//!
//! Why our own rather than a crate: `matrixmultiply` packs both operands into a freshly
//! allocated buffer on every call (6.4 MB of the Nature CNN's first dense layer on every
//! forward); `gemm` and `faer` pack per call as well; the crates with prepacked
//! operands (`gemmkit`, at 0.1; oneMKL's packed GEMM through `onemkl`) are new or
//! bring a native library; and none adds in `matrixmultiply`'s order, which is what
//! keeps every action the same. The kernel is portable Rust that the compiler
//! vectorises; on x86 it is compiled again with AVX2 and FMA (and, for convolutions,
//! AVX-512) enabled and chosen at run time.

/// Rows of one register tile (and of a [`PackedRows`] panel).
pub const MR: usize = 4;
/// Columns of one register tile (and of a [`PackedCols`] panel).
pub const NR: usize = 16;
/// Products summed before they are added to the output (`matrixmultiply`'s `S_KC`).
pub const KC: usize = 256;

/// `W[k, n]` (row-major) packed in panels of [`NR`] columns, each `[k, NR]`, the last
/// one padded with zeros: the right operand of a dense layer.
#[derive(Clone, Debug, Default)]
pub struct PackedCols {
    k: usize,
    n: usize,
    data: Vec<f32>,
}

impl PackedCols {
    /// Packs `w`, reusing this buffer (no allocation once it has held a matrix this size).
    ///
    /// # Panics
    /// If `w` is not `k · n` long.
    pub fn pack(&mut self, w: &[f32], k: usize, n: usize) {
        assert_eq!(w.len(), k * n, "weights are not [{k}, {n}]");
        let panels = n.div_ceil(NR);
        self.k = k;
        self.n = n;
        self.data.clear();
        self.data.resize(panels * k * NR, 0.0);
        if k == 0 {
            return;
        }
        for (jp, panel) in self.data.chunks_exact_mut(k * NR).enumerate() {
            let j0 = jp * NR;
            let width = NR.min(n - j0);
            for (p, dst) in panel.chunks_exact_mut(NR).enumerate() {
                dst[..width].copy_from_slice(&w[p * n + j0..][..width]);
            }
        }
    }

    /// `(k, n)` of the packed matrix.
    pub fn shape(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// `out[m, n] += x[m, k] · W` for the `m` rows of `x` (row-major, `out` too).
    ///
    /// # Panics
    /// If the lengths do not fit the shapes.
    pub fn mul_add_to(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        assert!(x.len() >= m * k && out.len() >= m * n, "x or out too short");
        if m == 0 || n == 0 || k == 0 {
            return;
        }
        match arithmetic() {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            // SAFETY: `arithmetic` saw AVX2 and FMA on this CPU; lengths checked above.
            Arithmetic::Fused => unsafe { dense_avx2_fma(self, x, m, out) },
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            Arithmetic::Fused => dense::<Fused>(self, x, m, out),
            Arithmetic::Separate => dense::<Separate>(self, x, m, out),
        }
    }
}

/// `W[m, k]` (row-major) packed in panels of [`MR`] rows, each `[k, MR]`, the last one
/// padded with zeros: the left operand of a convolution's product with its im2col matrix.
#[derive(Clone, Debug, Default)]
pub struct PackedRows {
    m: usize,
    k: usize,
    data: Vec<f32>,
}

impl PackedRows {
    /// Packs `w`, reusing this buffer (no allocation once it has held a matrix this size).
    ///
    /// # Panics
    /// If `w` is not `m · k` long.
    pub fn pack(&mut self, w: &[f32], m: usize, k: usize) {
        assert_eq!(w.len(), m * k, "weights are not [{m}, {k}]");
        let panels = m.div_ceil(MR);
        self.m = m;
        self.k = k;
        self.data.clear();
        self.data.resize(panels * k * MR, 0.0);
        if k == 0 {
            return;
        }
        for (ip, panel) in self.data.chunks_exact_mut(k * MR).enumerate() {
            for r in 0..MR.min(m - ip * MR) {
                let row = &w[(ip * MR + r) * k..][..k];
                for (p, v) in row.iter().enumerate() {
                    panel[p * MR + r] = *v;
                }
            }
        }
    }

    /// `(m, k)` of the packed matrix.
    pub fn shape(&self) -> (usize, usize) {
        (self.m, self.k)
    }

    /// `out[m, n] += W · cols[k, n]` (row-major, `out` too).
    ///
    /// # Panics
    /// If the lengths do not fit the shapes.
    pub fn mul_add_to(&self, cols: &[f32], n: usize, out: &mut [f32]) {
        let (m, k) = (self.m, self.k);
        assert!(
            cols.len() >= k * n && out.len() >= m * n,
            "cols or out too short"
        );
        if m == 0 || n == 0 || k == 0 {
            return;
        }
        BLOCK.with_borrow_mut(|b| {
            b.resize(KC * 4 * NR, 0.0);
            match arithmetic() {
                #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
                // SAFETY: `arithmetic` saw AVX2 and FMA on this CPU (and here AVX-512);
                // lengths checked above.
                Arithmetic::Fused => unsafe {
                    if std::arch::is_x86_feature_detected!("avx512f") {
                        conv_avx512(self, cols, n, out, b)
                    } else {
                        conv_avx2_fma(self, cols, n, out, b)
                    }
                },
                #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
                Arithmetic::Fused => conv::<Fused, NR>(self, cols, n, out, b),
                Arithmetic::Separate => conv::<Separate, NR>(self, cols, n, out, b),
            }
        });
    }
}

/// How products are added: as `matrixmultiply` 0.3's kernel choice does on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arithmetic {
    /// `acc = a·b + acc` rounded once.
    Fused,
    /// `acc = acc + a·b`, the product rounded first.
    Separate,
}

fn arithmetic() -> Arithmetic {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        // `matrixmultiply` takes its AVX2+FMA (or AVX-512) kernel on these, its plain AVX
        // or generic one (no FMA) otherwise. The detection is cached by std.
        if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2")
        {
            return Arithmetic::Fused;
        }
        Arithmetic::Separate
    }
    #[cfg(target_arch = "aarch64")]
    {
        Arithmetic::Fused
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Arithmetic::Separate
    }
}

trait MulAdd {
    /// `acc + a·b`.
    fn mul_add(a: f32, b: f32, acc: f32) -> f32;
}

struct Fused;
struct Separate;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, acc: f32) -> f32 {
        a.mul_add(b, acc)
    }
}

impl MulAdd for Separate {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, acc: f32) -> f32 {
        acc + a * b
    }
}

type Tile<const W: usize> = [[f32; W]; MR];

/// `A · B` over `kc` steps: `A`'s row `r` at `a[r][p · a_step]`, `B`'s `NR` columns
/// contiguous at `b[p · NR]`. The sums start from zero and add in order of `p`.
///
/// The operands are checked once here; the loop reads them unchecked, so that the
/// compiler keeps the tile in registers and vectorises over its columns.
#[inline(always)]
fn tile<F: MulAdd, const W: usize>(
    kc: usize,
    a: [&[f32]; MR],
    a_step: usize,
    b: &[f32],
) -> Tile<W> {
    assert!(b.len() >= kc * W);
    assert!(kc == 0 || a.iter().all(|row| row.len() > (kc - 1) * a_step));
    let a = a.map(<[f32]>::as_ptr);
    let b = b.as_ptr();
    let mut acc = [[0.0f32; W]; MR];
    for p in 0..kc {
        // SAFETY: `p · W + W ≤ kc · W ≤ b.len()`, checked above.
        let bv: [f32; W] = unsafe { std::ptr::read_unaligned(b.add(p * W).cast()) };
        for (row, acc) in a.iter().zip(acc.iter_mut()) {
            // SAFETY: `p · a_step ≤ (kc − 1) · a_step < row.len()`, checked above.
            let av = unsafe { *row.add(p * a_step) };
            for (c, bj) in acc.iter_mut().zip(bv) {
                *c = F::mul_add(av, bj, *c);
            }
        }
    }
    acc
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma")]
unsafe fn dense_avx2_fma(w: &PackedCols, x: &[f32], m: usize, out: &mut [f32]) {
    dense::<Fused>(w, x, m, out);
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma")]
unsafe fn conv_avx2_fma(w: &PackedRows, cols: &[f32], n: usize, out: &mut [f32], b: &mut [f32]) {
    conv::<Fused, NR>(w, cols, n, out, b);
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn conv_avx512(w: &PackedRows, cols: &[f32], n: usize, out: &mut [f32], b: &mut [f32]) {
    conv::<Fused, { 4 * NR }>(w, cols, n, out, b);
}

#[inline(always)]
fn dense<F: MulAdd>(w: &PackedCols, x: &[f32], m: usize, out: &mut [f32]) {
    let (k, n) = (w.k, w.n);
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        for (jp, panel) in w.data.chunks_exact(k * NR).enumerate() {
            let (j0, width) = (jp * NR, NR.min(n - jp * NR));
            let b = &panel[k0 * NR..][..kc * NR];
            for i0 in (0..m).step_by(MR) {
                let rows = MR.min(m - i0);
                // Rows past the end repeat the last one; their sums are not kept.
                let a = std::array::from_fn(|r| &x[(i0 + r.min(rows - 1)) * k + k0..][..kc]);
                let acc = tile::<F, NR>(kc, a, 1, b);
                for (r, acc) in acc.iter().enumerate().take(rows) {
                    let dst = &mut out[(i0 + r) * n + j0..][..width];
                    for (o, s) in dst.iter_mut().zip(acc) {
                        *o += *s;
                    }
                }
            }
        }
    }
}

thread_local! {
    /// Each thread's copy of one block of a convolution's im2col matrix, reused from
    /// call to call (allocated on a thread's first convolution).
    static BLOCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `out += W · cols`, `W` columns at a time ([`NR`], or four times that with AVX-512's
/// wider registers), each block of `cols` copied into `b` (at least `KC · W` long).
#[inline(always)]
fn conv<F: MulAdd, const W: usize>(
    w: &PackedRows,
    cols: &[f32],
    n: usize,
    out: &mut [f32],
    b: &mut [f32],
) {
    let (m, k) = (w.m, w.k);
    // One block of `cols`, `[kc, W]`, copied contiguous (rows of a wide im2col matrix
    // are far apart) and zero-padded past its last column.
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        for j0 in (0..n).step_by(W) {
            let width = W.min(n - j0);
            for (p, dst) in b.chunks_exact_mut(W).take(kc).enumerate() {
                dst[..width].copy_from_slice(&cols[(k0 + p) * n + j0..][..width]);
                dst[width..].fill(0.0);
            }
            for (ip, panel) in w.data.chunks_exact(k * MR).enumerate() {
                let rows = MR.min(m - ip * MR);
                let a_all = &panel[k0 * MR..][..kc * MR];
                let a = std::array::from_fn(|r| &a_all[r..]);
                let acc = tile::<F, W>(kc, a, MR, b);
                for (r, acc) in acc.iter().enumerate().take(rows) {
                    let dst = &mut out[(ip * MR + r) * n + j0..][..width];
                    for (o, s) in dst.iter_mut().zip(acc) {
                        *o += *s;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let v = ((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0 - 0.5;
                // Some exact zeros and negative zeros among them.
                if i % 37 == 0 {
                    -0.0
                } else {
                    v * 1.7
                }
            })
            .collect()
    }

    /// `matrixmultiply::sgemm` with α = β = 1: `c += a[m, k] · b[k, n]`.
    fn reference(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
        // SAFETY: row-major strides of the given shapes, lengths fit.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                1.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            );
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    const SHAPES: [(usize, usize, usize); 9] = [
        (1, 1, 1),
        (3, 4, 2),
        (8, 4, 128),
        (5, 128, 17),
        (16, 256, 32),
        (7, 257, 33),
        (16, 3136, 512),
        (2, 600, 6),
        (33, 513, 64),
    ];

    #[test]
    fn dense_products_are_matrixmultiplys_to_the_bit() {
        let mut packed = PackedCols::default();
        for (m, k, n) in SHAPES {
            let (x, w, bias) = (values(m * k, 1), values(k * n, 2), values(m * n, 3));
            packed.pack(&w, k, n);
            assert_eq!(packed.shape(), (k, n));
            let (mut ours, mut theirs) = (bias.clone(), bias);
            packed.mul_add_to(&x, m, &mut ours);
            reference(m, k, n, &x, &w, &mut theirs);
            assert_eq!(bits(&ours), bits(&theirs), "[{m}, {k}] · [{k}, {n}]");
        }
    }

    #[test]
    fn convolution_products_are_matrixmultiplys_to_the_bit() {
        let mut packed = PackedRows::default();
        for (m, k, n) in SHAPES {
            let (w, cols, bias) = (values(m * k, 4), values(k * n, 5), values(m * n, 6));
            packed.pack(&w, m, k);
            assert_eq!(packed.shape(), (m, k));
            let (mut ours, mut theirs) = (bias.clone(), bias);
            packed.mul_add_to(&cols, n, &mut ours);
            reference(m, k, n, &w, &cols, &mut theirs);
            assert_eq!(bits(&ours), bits(&theirs), "[{m}, {k}] · [{k}, {n}]");
        }
    }

    /// What `matrixmultiply` computes without FMA: per block of `KC`, products rounded
    /// and added in order from zero, each block's sum then added to `c`.
    fn reference_separate(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
        for i in 0..m {
            for j in 0..n {
                for k0 in (0..k).step_by(KC) {
                    let mut sum = 0.0f32;
                    for p in k0..(k0 + KC).min(k) {
                        sum += a[i * k + p] * b[p * n + j];
                    }
                    c[i * n + j] += sum;
                }
            }
        }
    }

    /// Each kernel this CPU can run, not only the one `arithmetic` picks.
    #[test]
    fn every_kernel_gives_the_same_bits() {
        let (mut rows, mut cols) = (PackedRows::default(), PackedCols::default());
        let mut block = vec![0.0f32; KC * 4 * NR];
        for (m, k, n) in SHAPES {
            let (a, b, c0) = (values(m * k, 10), values(k * n, 11), values(m * n, 12));
            rows.pack(&a, m, k);
            cols.pack(&b, k, n);
            let mut want = c0.clone();
            reference_separate(m, k, n, &a, &b, &mut want);
            let mut got = c0.clone();
            conv::<Separate, NR>(&rows, &b, n, &mut got, &mut block);
            assert_eq!(bits(&got), bits(&want), "separate, conv [{m}, {k}, {n}]");
            let mut got = c0.clone();
            dense::<Separate>(&cols, &a, m, &mut got);
            assert_eq!(bits(&got), bits(&want), "separate, dense [{m}, {k}, {n}]");
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            if arithmetic() == Arithmetic::Fused {
                let mut want = c0.clone();
                reference(m, k, n, &a, &b, &mut want);
                let mut got = c0.clone();
                // SAFETY: `arithmetic` saw AVX2 and FMA.
                unsafe { conv_avx2_fma(&rows, &b, n, &mut got, &mut block) };
                assert_eq!(bits(&got), bits(&want), "AVX2, conv [{m}, {k}, {n}]");
                if std::arch::is_x86_feature_detected!("avx512f") {
                    let mut got = c0.clone();
                    // SAFETY: AVX-512 seen.
                    unsafe { conv_avx512(&rows, &b, n, &mut got, &mut block) };
                    assert_eq!(bits(&got), bits(&want), "AVX-512, conv [{m}, {k}, {n}]");
                }
            }
        }
    }

    #[test]
    fn an_empty_inner_dimension_adds_nothing() {
        let (mut cols, mut rows) = (PackedCols::default(), PackedRows::default());
        cols.pack(&[], 0, 3);
        rows.pack(&[], 2, 0);
        let mut out = [1.0f32; 6];
        cols.mul_add_to(&[], 2, &mut out);
        rows.mul_add_to(&[], 3, &mut out);
        assert_eq!(out, [1.0; 6]);
    }

    #[test]
    fn repacking_a_smaller_matrix_leaves_nothing_of_the_larger() {
        let mut packed = PackedCols::default();
        packed.pack(&values(40 * 20, 7), 40, 20);
        let (x, w) = (values(3 * 5, 8), values(5 * 3, 9));
        packed.pack(&w, 5, 3);
        let (mut ours, mut theirs) = (vec![0.0; 9], vec![0.0; 9]);
        packed.mul_add_to(&x, 3, &mut ours);
        reference(3, 5, 3, &x, &w, &mut theirs);
        assert_eq!(bits(&ours), bits(&theirs));
    }
}
