//! The tensors of one transformer block as a typed set: [`BlockTensors`] has one field per
//! tensor, the architecture-dependent ones as `Option`s.
//!
//! The same struct carries each stage of a block's life: what a rank reads
//! (`BlockTensors<TensorSpec>`, made by [`super::shard::block_specs`] and nowhere else), the
//! bytes read (`BlockTensors<RawTensor>`, which the block constructor takes field by field),
//! and the layout of a block stored as FSDP pieces. Loading never looks a tensor up by name,
//! so the tensor set cannot drift between sharding and loading: a tensor the file lacks is a
//! read error naming the file and the tensor, and one the code lacks does not compile.

use std::convert::Infallible;

/// One transformer block's tensors (`T`: a spec, the bytes read, a stored entry, …).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockTensors<T> {
    pub attn_norm: T,
    pub wq: T,
    pub wk: T,
    pub wv: T,
    pub wo: T,
    pub ffn_norm: T,
    pub w_gate: T,
    pub w_up: T,
    pub w_down: T,
    /// Q/K/V biases (Qwen2).
    pub bq: Option<T>,
    pub bk: Option<T>,
    pub bv: Option<T>,
    /// Attention output bias (Llama with `attention_bias`).
    pub bo: Option<T>,
    /// Per-head RMSNorm of Q and K (Qwen3, Gemma 3).
    pub q_norm: Option<T>,
    pub k_norm: Option<T>,
    /// Norms of each branch's output before it joins the residual stream (Gemma 3).
    pub post_attn_norm: Option<T>,
    pub post_ffn_norm: Option<T>,
}

impl<T> BlockTensors<T> {
    /// Applies `f` to every tensor present, in the block's canonical order: the norms and
    /// projections of attention, then of the MLP, then the optional tensors. That order is
    /// written here only ([`Self::map`] and [`Self::into_vec`] follow it), and it is the
    /// order of a block's bytes stored as FSDP pieces.
    pub fn try_map<U, E>(self, mut f: impl FnMut(T) -> Result<U, E>) -> Result<BlockTensors<U>, E> {
        // A struct expression evaluates its fields in the order written.
        Ok(BlockTensors {
            attn_norm: f(self.attn_norm)?,
            wq: f(self.wq)?,
            wk: f(self.wk)?,
            wv: f(self.wv)?,
            wo: f(self.wo)?,
            ffn_norm: f(self.ffn_norm)?,
            w_gate: f(self.w_gate)?,
            w_up: f(self.w_up)?,
            w_down: f(self.w_down)?,
            bq: self.bq.map(&mut f).transpose()?,
            bk: self.bk.map(&mut f).transpose()?,
            bv: self.bv.map(&mut f).transpose()?,
            bo: self.bo.map(&mut f).transpose()?,
            q_norm: self.q_norm.map(&mut f).transpose()?,
            k_norm: self.k_norm.map(&mut f).transpose()?,
            post_attn_norm: self.post_attn_norm.map(&mut f).transpose()?,
            post_ffn_norm: self.post_ffn_norm.map(&mut f).transpose()?,
        })
    }

    /// [`Self::try_map`] with a function that cannot fail.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> BlockTensors<U> {
        match self.try_map(|t| Ok::<U, Infallible>(f(t))) {
            Ok(b) => b,
            Err(never) => match never {},
        }
    }

    /// The same set, borrowed.
    pub fn as_ref(&self) -> BlockTensors<&T> {
        BlockTensors {
            attn_norm: &self.attn_norm,
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            wo: &self.wo,
            ffn_norm: &self.ffn_norm,
            w_gate: &self.w_gate,
            w_up: &self.w_up,
            w_down: &self.w_down,
            bq: self.bq.as_ref(),
            bk: self.bk.as_ref(),
            bv: self.bv.as_ref(),
            bo: self.bo.as_ref(),
            q_norm: self.q_norm.as_ref(),
            k_norm: self.k_norm.as_ref(),
            post_attn_norm: self.post_attn_norm.as_ref(),
            post_ffn_norm: self.post_ffn_norm.as_ref(),
        }
    }

    /// The tensors present, in the canonical order.
    pub fn into_vec(self) -> Vec<T> {
        let mut all = Vec::with_capacity(17);
        self.map(|t| all.push(t));
        all
    }

    /// The tensors present, borrowed, in the canonical order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.as_ref().into_vec().into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field set to its position in the canonical order (the optional ones only where
    /// `with_optional`).
    fn numbered(with_optional: bool) -> BlockTensors<usize> {
        let some = |n: usize| with_optional.then_some(n);
        BlockTensors {
            attn_norm: 0,
            wq: 1,
            wk: 2,
            wv: 3,
            wo: 4,
            ffn_norm: 5,
            w_gate: 6,
            w_up: 7,
            w_down: 8,
            bq: some(9),
            bk: some(10),
            bv: some(11),
            bo: some(12),
            q_norm: some(13),
            k_norm: some(14),
            post_attn_norm: some(15),
            post_ffn_norm: some(16),
        }
    }

    #[test]
    fn map_visits_in_the_canonical_order_and_keeps_each_field_in_place() {
        let full = numbered(true);
        assert_eq!(full.clone().into_vec(), (0..17).collect::<Vec<_>>());
        assert_eq!(numbered(false).into_vec(), (0..9).collect::<Vec<_>>());
        let mut seen = Vec::new();
        let doubled = full.clone().map(|n| {
            seen.push(n);
            2 * n
        });
        assert_eq!(seen, (0..17).collect::<Vec<_>>());
        assert_eq!(doubled.wv, 6);
        assert_eq!(doubled.post_ffn_norm, Some(32));
        assert_eq!(
            full.iter().copied().collect::<Vec<_>>(),
            full.clone().into_vec()
        );
        assert_eq!(full.as_ref().map(|n| *n), full);
    }

    #[test]
    fn try_map_stops_at_the_first_error() {
        let mut visited = 0;
        let r = numbered(true).try_map(|n| {
            visited += 1;
            if n == 10 {
                Err(format!("tensor {n}"))
            } else {
                Ok(n)
            }
        });
        assert_eq!(r, Err("tensor 10".to_string()));
        assert_eq!(visited, 11);
    }
}
