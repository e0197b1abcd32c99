//! The device mesh: how the ranks of a world are arranged for data, pipeline and tensor
//! parallelism ([`ParallelDims`], following torchtune's `ParallelDims` plus `pp`).
//!
//! Ranks are laid out row-major over the dimensions `[pp, dp_replicate, dp_shard, cp, tp]`
//! (torchtitan's order: tensor-parallel peers are adjacent ranks, so they share a node when
//! ranks are packed by node; pipeline stages are the outermost split):
//!
//! ```text
//! rank = (((pp_i · dp_replicate + r_i) · dp_shard + s_i) · cp + c_i) · tp + t_i
//! ```
//!
//! - a **TP group** is the `tp` consecutive ranks that differ only in `t_i`;
//! - a **pipeline** is the `pp` ranks that differ only in `pp_i` (stride `world / pp`);
//! - a **model replica** is the `pp · cp · tp` ranks with the same `(r_i, s_i)`: together they
//!   hold one copy of the model and score one stream of windows;
//! - a **cp group** is the `cp` ranks that differ only in `c_i`: each holds two chunks of
//!   every window and they pass keys and values around in a ring (context parallelism);
//! - a **shard group** (FSDP) is the `dp_shard` ranks that differ only in `s_i`: each stores
//!   `1/dp_shard` of the weights its position in the replica needs.
//!
//! Replica `r_i · dp_shard + s_i` is led by its rank with `pp_i = 0, c_i = 0, t_i = 0`; the leaders form
//! the data-parallel world that shares out windows and sums the exact NLL (replica 0's leader
//! is rank 0).

use serde::{Deserialize, Serialize};

/// Degrees of parallelism. Each is at least 1 once resolved; their product is the world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParallelDims {
    pub dp_replicate: usize,
    pub dp_shard: usize,
    pub tp: usize,
    pub cp: usize,
    pub pp: usize,
}

impl Default for ParallelDims {
    fn default() -> Self {
        Self::data_parallel(1)
    }
}

/// Requested degrees before the world size is known: `dp_shard = -1` means "the rest".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RequestedDims {
    pub dp_replicate: Option<i64>,
    pub dp_shard: Option<i64>,
    pub tp: Option<i64>,
    pub cp: Option<i64>,
    pub pp: Option<i64>,
}

impl RequestedDims {
    /// The world size these degrees make, when none is left to infer.
    pub fn product(&self) -> Option<usize> {
        if !self.any() || self.dp_shard == Some(-1) {
            return None;
        }
        [self.dp_replicate, self.dp_shard, self.tp, self.cp, self.pp]
            .iter()
            .map(|d| d.unwrap_or(1).max(1) as usize)
            .try_fold(1usize, |a, b| a.checked_mul(b))
    }

    /// Whether any degree was asked for.
    pub fn any(&self) -> bool {
        [self.dp_replicate, self.dp_shard, self.tp, self.cp, self.pp]
            .iter()
            .any(|d| d.is_some())
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MeshError {
    #[error("--{flag} {value}: every parallel degree must be at least 1 (only --dp-shard may be -1, meaning \"the remaining ranks\")")]
    Degree { flag: &'static str, value: i64 },
    #[error("the mesh dp_replicate={dp_replicate} × dp_shard={dp_shard} × cp={cp} × tp={tp} × pp={pp} = {product} ranks, but the world has {world}; make the product equal the world size (--ranks N or mpirun -np N), or give --dp-shard -1 to fill the rest")]
    Product {
        dp_replicate: usize,
        dp_shard: usize,
        cp: usize,
        tp: usize,
        pp: usize,
        product: usize,
        world: usize,
    },
    #[error("--dp-shard -1 cannot be inferred: world size {world} is not divisible by dp_replicate·cp·tp·pp = {rest}; change the other degrees or the world size")]
    Infer { world: usize, rest: usize },
}

impl ParallelDims {
    pub fn data_parallel(n: usize) -> Self {
        Self {
            dp_replicate: 1,
            dp_shard: n,
            tp: 1,
            cp: 1,
            pp: 1,
        }
    }

    /// torchtune's rules: degrees ≥ 1, `dp_shard = -1` inferred, product = world size.
    pub fn resolve(req: &RequestedDims, world: usize) -> Result<Self, MeshError> {
        let get = |flag: &'static str, v: Option<i64>| -> Result<usize, MeshError> {
            match v {
                None => Ok(1),
                Some(v) if v >= 1 => Ok(v as usize),
                Some(value) => Err(MeshError::Degree { flag, value }),
            }
        };
        let dp_replicate = get("dp-replicate", req.dp_replicate)?;
        let tp = get("tp", req.tp)?;
        let cp = get("cp", req.cp)?;
        let pp = get("pp", req.pp)?;
        let rest = dp_replicate * tp * cp * pp;
        let dp_shard = match req.dp_shard {
            Some(-1) | None => {
                if !world.is_multiple_of(rest) {
                    return Err(MeshError::Infer { world, rest });
                }
                world / rest
            }
            Some(v) => get("dp-shard", Some(v))?,
        };
        let dims = Self {
            dp_replicate,
            dp_shard,
            tp,
            cp,
            pp,
        };
        if dims.world() != world {
            return Err(MeshError::Product {
                dp_replicate,
                dp_shard,
                cp,
                tp,
                pp,
                product: dims.world(),
                world,
            });
        }
        Ok(dims)
    }

    pub fn world(&self) -> usize {
        self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp
    }

    /// Model replicas: the data-parallel degree.
    pub fn replicas(&self) -> usize {
        self.dp_replicate * self.dp_shard
    }

    /// Whether the weights are split across ranks in any way.
    pub fn splits_model(&self) -> bool {
        self.tp > 1 || self.pp > 1 || self.cp > 1 || self.dp_shard > 1
    }

    pub fn coords(&self, rank: usize) -> Coords {
        let mut r = rank;
        let tp = r % self.tp;
        r /= self.tp;
        let cp = r % self.cp;
        r /= self.cp;
        let dp_shard = r % self.dp_shard;
        r /= self.dp_shard;
        let dp_replicate = r % self.dp_replicate;
        r /= self.dp_replicate;
        Coords {
            pp: r,
            dp_replicate,
            dp_shard,
            cp,
            tp,
        }
    }

    pub fn rank_of(&self, c: Coords) -> usize {
        (((c.pp * self.dp_replicate + c.dp_replicate) * self.dp_shard + c.dp_shard) * self.cp
            + c.cp)
            * self.tp
            + c.tp
    }

    /// The replica (data-parallel index) a rank belongs to.
    pub fn replica_of(&self, rank: usize) -> usize {
        let c = self.coords(rank);
        c.dp_replicate * self.dp_shard + c.dp_shard
    }

    /// The leader of each replica (`pp_i = 0`, `t_i = 0`), by replica index.
    pub fn leaders(&self) -> Vec<usize> {
        (0..self.replicas())
            .map(|r| {
                self.rank_of(Coords {
                    pp: 0,
                    dp_replicate: r / self.dp_shard,
                    dp_shard: r % self.dp_shard,
                    cp: 0,
                    tp: 0,
                })
            })
            .collect()
    }

    /// Ranks of `rank`'s TP group, in TP order.
    pub fn tp_group(&self, rank: usize) -> Vec<usize> {
        let c = self.coords(rank);
        (0..self.tp)
            .map(|tp| self.rank_of(Coords { tp, ..c }))
            .collect()
    }

    /// Ranks of `rank`'s context-parallel group (its ring), in cp order.
    pub fn cp_group(&self, rank: usize) -> Vec<usize> {
        let c = self.coords(rank);
        (0..self.cp)
            .map(|cp| self.rank_of(Coords { cp, ..c }))
            .collect()
    }

    /// `rank`'s pipeline stage within its replica: every cp and TP rank, in rank order (on
    /// stage 0 the replica's leader first).
    pub fn stage_group(&self, rank: usize) -> Vec<usize> {
        let c = self.coords(rank);
        (0..self.cp)
            .flat_map(|cp| (0..self.tp).map(move |tp| (cp, tp)))
            .map(|(cp, tp)| self.rank_of(Coords { cp, tp, ..c }))
            .collect()
    }

    /// Ranks of `rank`'s FSDP shard group, in shard order.
    pub fn shard_group(&self, rank: usize) -> Vec<usize> {
        let c = self.coords(rank);
        (0..self.dp_shard)
            .map(|dp_shard| self.rank_of(Coords { dp_shard, ..c }))
            .collect()
    }

    /// The rank at pipeline stage `stage` with `rank`'s other coordinates.
    pub fn at_stage(&self, rank: usize, stage: usize) -> usize {
        self.rank_of(Coords {
            pp: stage,
            ..self.coords(rank)
        })
    }

    /// A human-readable table of the mapping (`ppl validate`, docs).
    pub fn describe(&self) -> String {
        let mut out = format!(
            "mesh: dp_replicate={} dp_shard={} cp={} tp={} pp={} ({} ranks, {} model replica(s))\n",
            self.dp_replicate,
            self.dp_shard,
            self.cp,
            self.tp,
            self.pp,
            self.world(),
            self.replicas()
        );
        for replica in 0..self.replicas() {
            let leader = self.leaders()[replica];
            let stages: Vec<String> = (0..self.pp)
                .map(|s| {
                    let ranks: Vec<usize> = self
                        .cp_group(self.at_stage(leader, s))
                        .into_iter()
                        .flat_map(|r| self.tp_group(r))
                        .collect();
                    format!(
                        "stage {s}: ranks {}",
                        ranks
                            .iter()
                            .map(|r| r.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                })
                .collect();
            out += &format!("  replica {replica}: {}\n", stages.join(" | "));
        }
        out
    }
}

/// A rank's position in the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coords {
    pub pp: usize,
    pub dp_replicate: usize,
    pub dp_shard: usize,
    pub cp: usize,
    pub tp: usize,
}

/// Layers of each pipeline stage: contiguous, balanced by cost. The last stage also runs the
/// output layer, which costs about `head_layers` blocks, so it gets that many fewer (at least
/// one); the other stages share the rest evenly, earlier stages taking the remainder.
pub fn stage_layers(
    n_layers: usize,
    pp: usize,
    stage: usize,
    head_layers: usize,
) -> std::ops::Range<usize> {
    if pp <= 1 {
        return 0..n_layers;
    }
    let units = n_layers + head_layers;
    let last = (units / pp)
        .saturating_sub(head_layers)
        .clamp(1, n_layers.saturating_sub(pp - 1).max(1));
    if stage + 1 == pp {
        return n_layers - last..n_layers;
    }
    let rest = n_layers - last;
    let (base, extra) = (rest / (pp - 1), rest % (pp - 1));
    let start = stage * base + stage.min(extra);
    start..start + base + usize::from(stage < extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(dpr: i64, dps: i64, tp: i64, pp: i64) -> RequestedDims {
        RequestedDims {
            dp_replicate: Some(dpr),
            dp_shard: Some(dps),
            tp: Some(tp),
            cp: None,
            pp: Some(pp),
        }
    }

    #[test]
    fn dp_shard_is_inferred_and_products_are_checked() {
        let d = ParallelDims::resolve(&req(2, -1, 1, 1), 8).unwrap();
        assert_eq!((d.dp_replicate, d.dp_shard), (2, 4));
        let d = ParallelDims::resolve(&RequestedDims::default(), 3).unwrap();
        assert_eq!(d, ParallelDims::data_parallel(3));
        assert!(matches!(
            ParallelDims::resolve(&req(2, 2, 1, 1), 8),
            Err(MeshError::Product {
                product: 4,
                world: 8,
                ..
            })
        ));
        assert!(matches!(
            ParallelDims::resolve(&req(3, -1, 1, 1), 8),
            Err(MeshError::Infer { world: 8, rest: 3 })
        ));
        assert!(matches!(
            ParallelDims::resolve(&req(0, 1, 1, 1), 1),
            Err(MeshError::Degree {
                flag: "dp-replicate",
                value: 0
            })
        ));
        let cp = RequestedDims {
            cp: Some(2),
            pp: Some(2),
            dp_shard: Some(1),
            ..Default::default()
        };
        let d = ParallelDims::resolve(&cp, 4).unwrap();
        assert_eq!((d.cp, d.pp, d.dp_shard), (2, 2, 1));
        assert!(matches!(
            ParallelDims::resolve(&cp, 6),
            Err(MeshError::Product {
                product: 4,
                world: 6,
                ..
            })
        ));
    }

    #[test]
    fn coordinates_round_trip_and_groups_are_consistent() {
        let d = ParallelDims {
            dp_replicate: 2,
            dp_shard: 2,
            tp: 2,
            cp: 1,
            pp: 2,
        };
        for r in 0..d.world() {
            assert_eq!(d.rank_of(d.coords(r)), r);
            assert!(d.tp_group(r).contains(&r));
            assert!(d.shard_group(r).contains(&r));
        }
        // TP peers are adjacent; stages are the outermost split.
        assert_eq!(d.tp_group(5), vec![4, 5]);
        assert_eq!(d.at_stage(1, 1), 9);
        assert_eq!(d.leaders(), vec![0, 2, 4, 6]);
        assert_eq!(d.shard_group(0), vec![0, 2]);
        assert_eq!(d.replica_of(9), 0);
        assert_eq!(d.replica_of(15), 3);
    }

    #[test]
    fn cp_groups_are_rings_inside_a_replica() {
        // cp = 2 × tp = 2 × dp_replicate = 2 × pp = 2 on 16 ranks.
        let d = ParallelDims {
            dp_replicate: 2,
            dp_shard: 1,
            tp: 2,
            cp: 2,
            pp: 2,
        };
        for r in 0..d.world() {
            let g = d.cp_group(r);
            assert!(g.contains(&r));
            assert!(g.iter().all(|&m| d.replica_of(m) == d.replica_of(r)));
        }
        assert_eq!(d.cp_group(1), vec![1, 3]);
        assert_eq!(d.cp_group(13), vec![13, 15]);
        assert_eq!(d.stage_group(5), vec![4, 5, 6, 7]);
        assert_eq!(d.stage_group(11), vec![8, 9, 10, 11]);
        assert_eq!(d.leaders(), vec![0, 4]);
        assert!(d
            .describe()
            .contains("replica 0: stage 0: ranks 0,1,2,3 | stage 1: ranks 8,9,10,11"));
    }

    #[test]
    fn layers_split_by_cost_with_the_output_layer_on_the_last_stage() {
        let parts = |pp: usize, head: usize| -> Vec<_> {
            (0..pp).map(|s| stage_layers(30, pp, s, head)).collect()
        };
        assert_eq!(parts(4, 0), vec![0..8, 8..16, 16..23, 23..30]);
        assert_eq!(parts(2, 0), vec![0..15, 15..30]);
        // SmolLM2: the output layer costs about 4 blocks.
        assert_eq!(parts(2, 4), vec![0..17, 17..30]);
        assert_eq!(parts(4, 4), vec![0..9, 9..18, 18..26, 26..30]);
        // Every stage keeps at least one layer, however heavy the head.
        assert_eq!(parts(3, 100), vec![0..15, 15..29, 29..30]);
        assert_eq!(stage_layers(30, 1, 0, 4), 0..30);
        for pp in 1..=30 {
            let all: Vec<usize> = (0..pp).flat_map(|s| stage_layers(30, pp, s, 4)).collect();
            assert_eq!(all, (0..30).collect::<Vec<_>>(), "pp {pp}");
        }
    }
}
