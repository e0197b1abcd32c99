//! Typed messages: serde values as JSON bytes over a [`Communicator`], decoded with the
//! sender named in the error (a peer running another ppl version shows up as a protocol
//! error, not a panic). Written once here for every protocol that exchanges small records.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{CommError, Communicator};

/// A value as a message. Our protocol types always serialize (no maps with non-string keys,
/// no failing `Serialize` impls), so a failure is a bug.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("protocol messages serialize")
}

/// A message from rank `from` as a value.
pub fn decode<T: DeserializeOwned>(from: usize, b: &[u8]) -> Result<T, CommError> {
    serde_json::from_slice(b).map_err(|e| CommError::Protocol {
        from,
        detail: e.to_string(),
    })
}

/// `root`'s value on every rank: `root` passes `Some(v)`, the others `None`.
pub fn broadcast<T: Serialize + DeserializeOwned>(
    comm: &dyn Communicator,
    root: usize,
    v: Option<&T>,
) -> Result<T, CommError> {
    let bytes = comm.broadcast(root, v.map(encode).unwrap_or_default())?;
    decode(root, &bytes)
}

/// Every rank's value, in rank order, on `root` (`None` elsewhere).
pub fn gather<T: Serialize + DeserializeOwned>(
    comm: &dyn Communicator,
    root: usize,
    v: &T,
) -> Result<Option<Vec<T>>, CommError> {
    let Some(all) = comm.gather(root, encode(v))? else {
        return Ok(None);
    };
    all.iter()
        .enumerate()
        .map(|(r, b)| decode(r, b))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local;

    /// What one rank got: the gather (root only) and the broadcast value.
    type Got = (Option<Vec<(usize, String)>>, Vec<u32>);

    #[test]
    fn gather_and_broadcast_carry_typed_values() {
        let comms = local::world(3);
        let got: Vec<Got> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let r = c.rank();
                        let all = gather(c, 0, &(r, format!("rank {r}"))).unwrap();
                        let root_value = vec![7u32, 8, 9];
                        let b = broadcast(c, 0, (r == 0).then_some(&root_value)).unwrap();
                        (all, b)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            got[0].0,
            Some(vec![
                (0, "rank 0".to_string()),
                (1, "rank 1".to_string()),
                (2, "rank 2".to_string())
            ])
        );
        assert_eq!((got[1].0.clone(), got[2].0.clone()), (None, None));
        assert!(got.iter().all(|g| g.1 == vec![7, 8, 9]));
    }

    #[test]
    fn an_unreadable_message_names_its_sender() {
        let e = decode::<Vec<u32>>(4, b"{not json").unwrap_err();
        assert!(matches!(e, CommError::Protocol { from: 4, .. }), "{e:?}");
    }
}
