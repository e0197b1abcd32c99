//! One input's quantized activations, shared by every matrix that multiplies it: a layer's
//! Q, K and V projections read the same normalised hidden states, and so do its gate and up
//! projections. Each kernel family quantizes its activations (Q8_1 blocks for the 32-value
//! formats, Q8_K super-blocks for the K-quants) deterministically from the input alone, so
//! making them once and handing the same panels to each matrix gives every product the same
//! bits as quantizing per matrix did — three and two times over, about a third of the
//! quantizer's work per layer.

use std::sync::OnceLock;

use super::kquant::q8k::Q8KPanels;
use super::rows16::{Activations, Q8Panels};

/// `x [m, k]` (row-major) and its quantized forms, each made on first use.
pub struct SharedInput<'x> {
    x: &'x [f32],
    m: usize,
    q8: OnceLock<Q8Panels>,
    q8k: OnceLock<Q8KPanels>,
}

impl<'x> SharedInput<'x> {
    /// `x` holds `m` rows.
    pub fn new(x: &'x [f32], m: usize) -> Self {
        Self {
            x,
            m,
            q8: OnceLock::new(),
            q8k: OnceLock::new(),
        }
    }

    /// The input.
    pub fn x(&self) -> &'x [f32] {
        self.x
    }

    /// Its rows.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// The Q8_1 panels of a matrix with `k` inputs.
    pub(crate) fn q8(&self, k: usize) -> &Q8Panels {
        assert_eq!(self.x.len(), self.m * k, "activation shape");
        self.q8
            .get_or_init(|| <Q8Panels as Activations>::quantize(self.x, self.m, k))
    }

    /// The Q8_K panels of a matrix with `k` inputs.
    pub(crate) fn q8k(&self, k: usize) -> &Q8KPanels {
        assert_eq!(self.x.len(), self.m * k, "activation shape");
        self.q8k
            .get_or_init(|| Q8KPanels::quantize(self.x, self.m, k))
    }
}
