//! A communication failure inside a collective of the forward pass (the tensor-parallel
//! all-reduce, the context-parallel ring) leaves the model as [`ModelError::Comm`] and reaches
//! the run as the communicator's own error, with its structure.

use candle_core::{Device, Tensor};

use super::*;
use crate::comm::local;
use crate::run::EvalError;

/// Hidden states of one window of 4 positions of the tiny model.
fn hidden(t: usize) -> Tensor {
    Tensor::zeros((1, t, 64), candle_core::DType::F32, &Device::Cpu).unwrap()
}

fn assert_rank_1_failed(e: &RunError) {
    match e {
        RunError::Comm(CommError::RankFailed {
            rank: 1, reason, ..
        }) => {
            assert_eq!(reason, "rank 1 is gone")
        }
        other => panic!("expected rank 1's failure, got {other:?}"),
    }
}

#[test]
fn a_lost_tensor_parallel_peer_surfaces_as_its_comm_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::test_util::tiny_llama(dir.path());
    let world = local::world(2);
    world[1].abort("rank 1 is gone");
    let metered = Metered::new(&world[0]);
    let dims = ParallelDims {
        tp: 2,
        ..ParallelDims::default()
    };
    let runner = StageRunner::new(&metered, dims, &model, &[], CommDtype::F32);
    let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu).unwrap();
    // The embedding's all-reduce, and the one after a block's attention.
    let e = runner.model_call(|cc| model.embed(&ids, cc)).unwrap_err();
    assert_rank_1_failed(&e);
    let e = runner
        .model_call(|cc| model.run_layers(Some(hidden(4)), cc))
        .unwrap_err();
    assert_rank_1_failed(&e);
    // The run reports it as any other communication failure, in the communicator's words.
    let reported = EvalError::from(e);
    assert!(
        matches!(
            reported,
            EvalError::Comm(CommError::RankFailed { rank: 1, .. })
        ),
        "{reported:?}"
    );
    assert!(
        reported.to_string().ends_with("failed: rank 1 is gone"),
        "{reported}"
    );
    // Without collectives the same model runs: the failure came from the hook.
    assert!(model.embed(&ids, &Collectives::NONE).is_ok());
}

#[test]
fn the_forward_pass_returns_a_hooks_comm_error_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::test_util::tiny_llama(dir.path());
    let timeout = || CommError::Timeout {
        rank: 0,
        peer: "3".into(),
        seconds: 7,
    };
    let reduce = |_: Tensor| -> Result<Tensor, ModelError> { Err(ModelError::Comm(timeout())) };
    let cc = Collectives {
        tp_all_reduce: Some(&reduce),
        fsdp_all_gather: None,
        context_parallel: None,
    };
    match model.run_layers(Some(hidden(4)), &cc) {
        Err(ModelError::Comm(CommError::Timeout {
            rank: 0,
            peer,
            seconds: 7,
        })) => assert_eq!(peer, "3"),
        other => panic!("expected the hook's timeout, got {other:?}"),
    }
    let e = RunError::from(ModelError::Comm(timeout()));
    assert!(
        matches!(e, RunError::Comm(CommError::Timeout { .. })),
        "{e:?}"
    );
    assert_eq!(e.to_string(), timeout().to_string());
}

/// Rank 0 of `world` runs the tiny model's layers over a context-parallel ring of two, whose
/// other member is `world[1]`: the error that ends it.
fn ring_layers_error(model: &crate::model::Llama, world: &[local::LocalComm]) -> RunError {
    let dims = ParallelDims {
        cp: 2,
        ..ParallelDims::default()
    };
    let layout = ChunkLayout::new(2, 8).unwrap();
    let metered = Metered::new(&world[0]);
    let runner = StageRunner::new(&metered, dims, model, &[], CommDtype::F32);
    let ring = Ring::new(&runner.cp, layout, CommDtype::F32, &runner.ring);
    runner
        .model_call_with(Some(&ring), |cc| model.run_layers(Some(hidden(4)), cc))
        .unwrap_err()
}

#[test]
fn a_lost_or_garbled_ring_peer_surfaces_as_its_comm_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::test_util::tiny_llama(dir.path());

    // The peer is gone.
    let world = local::world(2);
    world[1].abort("rank 1 is gone");
    assert_rank_1_failed(&ring_layers_error(&model, &world));

    // The peer sends a key/value block of the wrong size: a protocol error naming it.
    let world = local::world(2);
    let peer = Group::new(&world[1], vec![0, 1], base::CONTEXT_PARALLEL);
    peer.send(0, 1, vec![0u8; 12]).unwrap();
    match ring_layers_error(&model, &world) {
        RunError::Comm(CommError::Protocol { from: 1, detail }) => {
            assert!(detail.contains("a key/value block of 6 bytes"), "{detail}")
        }
        other => panic!("expected a protocol error from rank 1, got {other:?}"),
    }
}
