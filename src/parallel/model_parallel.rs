//! Model-parallel execution: the ranks of a model replica (pipeline stages × tensor-parallel
//! ranks, each possibly holding FSDP pieces) score windows together.
//!
//! Work moves in **steps**. The replica's leader (stage 0, TP rank 0) takes a unit of windows
//! from the data-parallel protocol ([`super::data_parallel`]) and cuts it into micro-batches (one window
//! each when there are several stages, so that stage `s` works on micro-batch `k` while stage
//! `s+1` works on `k−1`). For each micro-batch the leader decides the step and tells its
//! stage's TP peers; every stage runs its blocks and hands the step with its activations to
//! the same TP index of the next stage; the last stage computes the NLL (vocabulary-parallel
//! under TP: each rank sends its partial log-softmax rows, never logits) and its TP rank 0
//! returns the window records to the leader.
//!
//! Under FSDP (`dp_shard > 1`) the ranks of a shard group all-gather each layer before using
//! it, so they must run the same number of steps: before each step the leaders of a shard
//! group exchange whether they have work; a leader without work runs an **idle** step (it
//! joins the gathers and computes nothing) until none has work, then everyone gets **done**.
//!
//! Exactness: pipeline stages and FSDP gathers move exact f32 activations and exact weight
//! bytes, so `pp` and `dp_shard` give bit-identical results. Tensor parallelism sums partial
//! products of the row-parallel projections across ranks (a different float summation order)
//! and combines the vocabulary split's log-softmax in another order, so `tp > 1` agrees with
//! `tp = 1` to about 1e-6 relative, not to the bit.

use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::context_parallel::{self as cp, Ring, RingMeter};
use super::data_parallel::{RunError, Scorer};
use super::mesh::ParallelDims;
use crate::comm::codec::{self, CommDtype};
use crate::comm::group::{base, Group, Metered};
use crate::comm::json::{decode as decode_json, encode as encode_json};
use crate::comm::{CommError, Communicator};
use crate::data::Window;
use crate::eval::{self, nll, WindowResult};
use crate::model::ring_attention::{ChunkLayout, ContextParallel};
use crate::model::{Collectives, Llama, ModelError};

/// World tags of the model-parallel traffic.
pub mod tag {
    /// A step and its activations, stage to stage.
    pub const PIPE: u32 = 20;
    /// Window records, last stage to the leader.
    pub const RESULTS: u32 = 21;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Step {
    /// Score these windows.
    Work(Vec<usize>),
    /// Join the FSDP gathers, compute nothing.
    Idle,
    /// No more steps.
    Done,
}

/// Per-rank figures of a model-parallel run.
#[derive(Debug, Clone, Default)]
pub struct StageFigures {
    pub steps: u64,
    /// Seconds inside steps, communication included.
    pub busy_s: f64,
    /// Seconds of communication inside steps.
    pub step_comm_s: f64,
}

/// One rank's part of a model replica.
pub struct StageRunner<'a> {
    world: &'a Metered<'a>,
    dims: ParallelDims,
    model: &'a Llama,
    windows: &'a [Window],
    tp: Group<'a>,
    shard: Group<'a>,
    /// The ranks that differ only in their cp coordinate (the ring).
    cp: Group<'a>,
    /// This rank's stage of the replica (every cp and TP rank): on stage 0 the leader tells
    /// it each step.
    stage_peers: Group<'a>,
    stage: usize,
    comm_dtype: CommDtype,
    /// Micro-batches the leader sent down the pipeline whose records have not come back.
    in_flight: usize,
    pub figures: StageFigures,
    /// Bytes and seconds of the context-parallel ring.
    pub ring: RingMeter,
    /// GPU-to-GPU sums of the tensor-parallel activations (`--tp-backend nccl`).
    #[cfg(feature = "nccl")]
    nccl: Option<crate::comm::nccl::NcclGroup>,
}

/// Micro-batches a pipeline leader keeps in flight per stage: enough that every stage has
/// its next one queued while it works.
const IN_FLIGHT_PER_STAGE: usize = 2;

impl<'a> StageRunner<'a> {
    pub fn new(
        world: &'a Metered<'a>,
        dims: ParallelDims,
        model: &'a Llama,
        windows: &'a [Window],
        comm_dtype: CommDtype,
    ) -> Self {
        let rank = world.rank();
        Self {
            tp: Group::new(world, dims.tp_group(rank), base::TENSOR_PARALLEL),
            shard: Group::new(world, dims.shard_group(rank), base::SHARD),
            cp: Group::new(world, dims.cp_group(rank), base::CONTEXT_PARALLEL),
            stage_peers: Group::new(world, dims.stage_group(rank), base::STEP),
            stage: dims.coords(rank).pp,
            world,
            dims,
            model,
            windows,
            comm_dtype,
            in_flight: 0,
            figures: StageFigures::default(),
            ring: RingMeter::default(),
            #[cfg(feature = "nccl")]
            nccl: None,
        }
    }

    /// Sums the tensor-parallel activations with NCCL on the GPUs instead of on the host
    /// (collective: every rank of the world calls it).
    pub fn with_nccl(self) -> Result<Self, CommError> {
        #[cfg(feature = "nccl")]
        {
            let nccl = if self.dims.tp > 1 {
                Some(crate::comm::nccl::NcclGroup::new(
                    &self.tp,
                    self.model.device(),
                )?)
            } else {
                None
            };
            Ok(Self { nccl, ..self })
        }
        #[cfg(not(feature = "nccl"))]
        {
            drop(self);
            Err(CommError::Transport(
                "this ppl was built without NCCL support: rebuild it with `cargo build --release --features nccl`, or use --tp-backend host".into(),
            ))
        }
    }

    /// Whether this rank leads its replica (and takes part in the data-parallel protocol).
    pub fn is_leader(&self) -> bool {
        self.leader() == self.world.rank()
    }

    fn is_last(&self) -> bool {
        self.stage + 1 == self.dims.pp
    }

    fn leader(&self) -> usize {
        let c = self.dims.coords(self.world.rank());
        self.dims.rank_of(super::mesh::Coords {
            pp: 0,
            cp: 0,
            tp: 0,
            ..c
        })
    }

    /// A non-leader's life: run the steps it is handed until `Done`.
    pub fn follow(&mut self) -> Result<(), RunError> {
        // PPL_DEBUG_STALL_RANK: its peers then wait inside the forward pass.
        if super::data_parallel::stalled_for_testing(self.world.rank()) {
            return Ok(());
        }
        loop {
            let (step, x) = self.receive_step()?;
            let done = step == Step::Done;
            self.run_step(step, x)?;
            if done {
                return Ok(());
            }
        }
    }

    /// The step and activations from the previous stage, or the step from the TP leader.
    fn receive_step(&self) -> Result<(Step, Option<Tensor>), RunError> {
        if self.stage == 0 {
            let b = self.stage_peers.broadcast(0, Vec::new())?;
            return Ok((decode_json(0, &b)?, None));
        }
        let prev = self.dims.at_stage(self.world.rank(), self.stage - 1);
        let b = self.world.recv(prev, tag::PIPE)?;
        let (step, act) = split_message(prev, &b)?;
        let x = match (&step, act) {
            (Step::Work(unit), Some(a)) => Some(self.activation(prev, unit, a)?),
            (Step::Work(_), None) => {
                return Err(CommError::Protocol {
                    from: prev,
                    detail: "a work step without activations".into(),
                }
                .into())
            }
            _ => None,
        };
        Ok((step, x))
    }

    fn activation(&self, from: usize, unit: &[usize], bytes: &[u8]) -> Result<Tensor, RunError> {
        let d = self.model.config.hidden_size;
        let t = self.local_len(self.windows[unit[0]].input.len());
        let v = codec::decode(bytes, d, self.comm_dtype)
            .filter(|v| v.len() == unit.len() * t * d)
            .ok_or_else(|| CommError::Protocol {
                from,
                detail: format!(
                    "activations of {} bytes for {} windows of {t} tokens",
                    bytes.len(),
                    unit.len()
                ),
            })?;
        let x = Tensor::from_vec(v, (unit.len(), t, d), &Device::Cpu)
            .and_then(|x| x.to_device(self.model.device()))
            .map_err(ModelError::from)?;
        Ok(x)
    }

    /// The leader's decision for the next step: with FSDP, agreed with the shard group.
    fn lead_step(&self, wish: Option<Vec<usize>>) -> Result<Step, RunError> {
        let any_other = if self.dims.dp_shard > 1 {
            let flags = self.shard.all_gather(vec![u8::from(wish.is_some())])?;
            flags.iter().any(|f| f.first() == Some(&1))
        } else {
            false
        };
        let step = match wish {
            Some(unit) => Step::Work(unit),
            None if any_other => Step::Idle,
            None => Step::Done,
        };
        if self.stage_peers.size() > 1 {
            self.stage_peers.broadcast(0, encode_json(&step))?;
        }
        Ok(step)
    }

    /// Positions of a window of `len` held by this rank.
    fn local_len(&self, len: usize) -> usize {
        len / self.dims.cp
    }

    /// The cut of this step's windows across the cp group (`None` without context
    /// parallelism).
    fn layout(&self, batch: &[Window]) -> Result<Option<ChunkLayout>, RunError> {
        if self.dims.cp == 1 {
            return Ok(None);
        }
        let len = batch[0].input.len();
        let layout = ChunkLayout::new(self.dims.cp, len).ok_or_else(|| {
            ModelError::Run(
                cp::check_window(self.dims.cp, len, "the window length")
                    .err()
                    .unwrap_or_default(),
            )
        })?;
        Ok(Some(layout))
    }

    /// Runs one step on this rank. Returns window records on the rank that ends up with them
    /// (the leader); forwards everything else.
    fn run_step(
        &mut self,
        step: Step,
        input: Option<Tensor>,
    ) -> Result<Option<Vec<WindowResult>>, RunError> {
        let t0 = Instant::now();
        let comm0 = self.world.traffic().seconds;
        let out = self.run_step_inner(step, input);
        self.figures.steps += 1;
        self.figures.busy_s += t0.elapsed().as_secs_f64();
        self.figures.step_comm_s += self.world.traffic().seconds - comm0;
        out
    }

    fn run_step_inner(
        &self,
        step: Step,
        input: Option<Tensor>,
    ) -> Result<Option<Vec<WindowResult>>, RunError> {
        let next = (!self.is_last()).then(|| self.dims.at_stage(self.world.rank(), self.stage + 1));
        let unit = match step {
            Step::Done => {
                if let Some(n) = next {
                    self.world
                        .send(n, tag::PIPE, join_message(&Step::Done, None))?;
                }
                return Ok(None);
            }
            Step::Idle => {
                self.model_call(|cc| self.model.run_layers(None, cc))?;
                if let Some(n) = next {
                    self.world
                        .send(n, tag::PIPE, join_message(&Step::Idle, None))?;
                }
                return Ok(None);
            }
            Step::Work(unit) => unit,
        };
        let batch: Vec<Window> = unit.iter().map(|&i| self.windows[i].clone()).collect();
        let layout = self.layout(&batch)?;
        let ring = layout.map(|l| Ring::new(&self.cp, l, self.comm_dtype, &self.ring));
        let ring = ring.as_ref().map(|r| r as &dyn ContextParallel);
        let x = match input {
            Some(x) => x,
            None => self.model_call(|cc| {
                let ids = match layout {
                    Some(l) => cp::local_ids(&batch, l, self.cp.rank(), self.model.device())?,
                    None => eval::batch_ids(&batch, self.model.device())?,
                };
                self.model.embed(&ids, cc)
            })?,
        };
        let x = self
            .model_call_with(ring, |cc| self.model.run_layers(Some(x), cc))?
            .expect("a work step returns activations");
        if let Some(n) = next {
            let d = self.model.config.hidden_size;
            let v = x
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(ModelError::from)?;
            let payload = codec::encode(&v, d, self.comm_dtype);
            self.world.send(
                n,
                tag::PIPE,
                join_message(&Step::Work(unit), Some(&payload)),
            )?;
            return Ok(None);
        }
        // The last stage: NLL of the scored positions.
        let hidden = self.model.final_norm(&x)?;
        let (rows, targets, batch) = match layout {
            Some(l) => cp::local_scored_rows(&hidden, &batch, l, self.cp.rank())?,
            None => {
                let (rows, targets) = eval::scored_rows(&hidden, &batch)?;
                (rows, targets, batch)
            }
        };
        let nlls = if self.dims.tp == 1 {
            Some(eval::nlls(self.model, &rows, &targets)?)
        } else {
            let mine = eval::partial_rows(self.model, &rows, &targets)?;
            match self.tp.gather(0, encode_json(&mine))? {
                None => None,
                Some(all) => {
                    let parts = all
                        .iter()
                        .enumerate()
                        .map(|(r, b)| decode_json::<Vec<nll::PartialRow>>(r, b))
                        .collect::<Result<Vec<_>, _>>()?;
                    let mut out = Vec::with_capacity(targets.len());
                    for i in 0..targets.len() {
                        let row: Vec<nll::PartialRow> = parts.iter().map(|p| p[i]).collect();
                        out.push(nll::combine(&row).ok_or_else(|| CommError::Protocol {
                            from: 0,
                            detail: format!("no TP rank holds target token {}", targets[i]),
                        })?);
                    }
                    Some(out)
                }
            }
        };
        let Some(nlls) = nlls else { return Ok(None) };
        let results = eval::window_results(&batch, &nlls)?;
        let leader = self.leader();
        if leader == self.world.rank() {
            Ok(Some(results))
        } else {
            self.world
                .send(leader, tag::RESULTS, encode_json(&results))?;
            Ok(None)
        }
    }

    /// Runs a model function with this rank's collectives; a communication failure inside it
    /// travels through the forward pass as [`ModelError::Comm`] and comes back as the
    /// original [`CommError`] ([`RunError::Comm`]).
    fn model_call<T>(
        &self,
        f: impl FnOnce(&Collectives) -> Result<T, ModelError>,
    ) -> Result<T, RunError> {
        self.model_call_with(None, f)
    }

    /// [`Self::model_call`] with the context-parallel ring of a work step.
    fn model_call_with<T>(
        &self,
        ring: Option<&dyn ContextParallel>,
        f: impl FnOnce(&Collectives) -> Result<T, ModelError>,
    ) -> Result<T, RunError> {
        let d = self.model.config.hidden_size;
        let reduce = |x: Tensor| -> Result<Tensor, ModelError> {
            #[cfg(feature = "nccl")]
            if let Some(nccl) = &self.nccl {
                return Ok(nccl.all_reduce_sum(&x)?);
            }
            let dims = x.dims().to_vec();
            let v = x.flatten_all()?.to_vec1::<f32>()?;
            let sum = self.tp_all_reduce(&v, d)?;
            Ok(Tensor::from_vec(sum, dims, x.device())?)
        };
        let gather = |piece: &[u8]| -> Result<Vec<Vec<u8>>, ModelError> {
            self.shard
                .all_gather_direct(crate::comm::tag::GATHER_DIRECT, piece.to_vec())
                .map_err(ModelError::Comm)
        };
        let cc = Collectives {
            tp_all_reduce: (self.dims.tp > 1).then_some(&reduce as _),
            fsdp_all_gather: (self.dims.dp_shard > 1).then_some(&gather as _),
            context_parallel: ring,
        };
        f(&cc).map_err(RunError::from)
    }
}

impl StageRunner<'_> {
    /// Sum of `v` (rows of `row` values) over the TP group: a reduce-scatter (rank `j` sums
    /// row block `j` of every rank's part, in rank order) then an all-gather of the sums, so
    /// each rank sends and receives `2·(tp−1)/tp` of the vector and every rank ends with the
    /// same bits. Parts travel as `--comm-dtype`; a rank's own part goes through the same
    /// encoding, so the result does not depend on which rank summed which block.
    fn tp_all_reduce(&self, v: &[f32], row: usize) -> Result<Vec<f32>, CommError> {
        use crate::comm::tag::{ALL_GATHER_SUMS, REDUCE_SCATTER};
        let (n, me) = (self.tp.size(), self.tp.rank());
        let rows = v.len() / row;
        let seg = |j: usize| {
            let r = crate::model::shard::split(rows, n, j);
            r.start * row..r.end * row
        };
        let dt = self.comm_dtype;
        let bad = |from: usize| CommError::Protocol {
            from,
            detail: "a partial sum of the wrong size".into(),
        };
        for j in (0..n).filter(|&j| j != me) {
            self.tp
                .send(j, REDUCE_SCATTER, codec::encode(&v[seg(j)], row, dt))?;
        }
        let mine = seg(me);
        let mut sum = vec![0f32; mine.len()];
        for r in 0..n {
            let bytes = if r == me {
                codec::encode(&v[mine.clone()], row, dt)
            } else {
                self.tp.recv(r, REDUCE_SCATTER)?
            };
            let part = codec::decode(&bytes, row, dt)
                .filter(|p| p.len() == sum.len())
                .ok_or_else(|| bad(r))?;
            if r == 0 {
                sum = part;
            } else {
                sum.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
            }
        }
        let encoded = codec::encode(&sum, row, dt);
        for j in (0..n).filter(|&j| j != me) {
            self.tp.send(j, ALL_GATHER_SUMS, encoded.clone())?;
        }
        let mut out = Vec::with_capacity(v.len());
        for j in 0..n {
            let bytes = if j == me {
                encoded.clone()
            } else {
                self.tp.recv(j, ALL_GATHER_SUMS)?
            };
            let part = codec::decode(&bytes, row, dt)
                .filter(|p| p.len() == seg(j).len())
                .ok_or_else(|| bad(j))?;
            out.extend(part);
        }
        Ok(out)
    }
}

impl StageRunner<'_> {
    /// The records of the oldest micro-batch in flight, from the last stage.
    fn receive_results(&mut self) -> Result<Vec<WindowResult>, RunError> {
        self.in_flight -= 1;
        self.collect_results(None)
    }

    /// The records of a micro-batch from the last stage's TP rank 0 of every cp rank (this
    /// rank's own in `own` when it is one of them), added up.
    fn collect_results(
        &self,
        mut own: Option<Vec<WindowResult>>,
    ) -> Result<Vec<WindowResult>, RunError> {
        let me = self.dims.coords(self.world.rank());
        let mut parts = Vec::with_capacity(self.dims.cp);
        for c in 0..self.dims.cp {
            let from = self.dims.rank_of(super::mesh::Coords {
                pp: self.dims.pp - 1,
                cp: c,
                tp: 0,
                ..me
            });
            let records = match own.take() {
                Some(r) if from == self.world.rank() => r,
                other => {
                    own = other;
                    decode_json::<Vec<WindowResult>>(from, &self.world.recv(from, tag::RESULTS)?)?
                }
            };
            parts.push((from, records));
        }
        let mut merged = cp::merge_records(parts)?;
        // A partial record counted only its rank's share of the window's tokens.
        for r in &mut merged {
            r.input_tokens = self.windows[r.index].input.len();
        }
        Ok(merged)
    }
}

impl Scorer for StageRunner<'_> {
    type Output = WindowResult;
    /// Without pipeline stages the unit is one step and its records come back at once. With
    /// them, each window is a micro-batch pushed into the pipeline; records are collected only
    /// once `IN_FLIGHT_PER_STAGE · pp` micro-batches are in flight, so the stages overlap
    /// across units too.
    fn score(&mut self, unit: &[usize]) -> Result<Vec<WindowResult>, RunError> {
        let mut out = Vec::with_capacity(unit.len());
        if self.dims.pp == 1 {
            let step = self.lead_step(Some(unit.to_vec()))?;
            let own = self.run_step(step, None)?;
            out.extend(self.collect_results(own)?);
            return Ok(out);
        }
        for &w in unit {
            let step = self.lead_step(Some(vec![w]))?;
            self.run_step(step, None)?;
            self.in_flight += 1;
            while self.in_flight >= IN_FLIGHT_PER_STAGE * self.dims.pp {
                out.extend(self.receive_results()?);
            }
        }
        Ok(out)
    }

    fn finish(&mut self) -> Result<Vec<WindowResult>, RunError> {
        let mut out = Vec::new();
        while self.in_flight > 0 {
            out.extend(self.receive_results()?);
        }
        loop {
            let step = self.lead_step(None)?;
            let done = step == Step::Done;
            self.run_step(step, None)?;
            if done {
                return Ok(out);
            }
        }
    }
}

/// A pipeline message: the step as JSON, then the activations' bytes.
fn join_message(step: &Step, activations: Option<&[u8]>) -> Vec<u8> {
    let head = encode_json(step);
    let mut out = Vec::with_capacity(8 + head.len() + activations.map_or(0, |a| a.len()));
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    if let Some(a) = activations {
        out.extend_from_slice(a);
    }
    out
}

fn split_message(from: usize, b: &[u8]) -> Result<(Step, Option<&[u8]>), CommError> {
    let bad = || CommError::Protocol {
        from,
        detail: "a truncated pipeline message".into(),
    };
    let len = u64::from_le_bytes(b.get(..8).ok_or_else(bad)?.try_into().expect("8 bytes")) as usize;
    let head = b.get(8..8 + len).ok_or_else(bad)?;
    let step = decode_json(from, head)?;
    let rest = &b[8 + len..];
    Ok((step, (!rest.is_empty()).then_some(rest)))
}

#[cfg(test)]
#[path = "model_parallel_tests.rs"]
mod tests;
