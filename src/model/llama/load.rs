//! Loading: a [`Llama`] (or the part of it a rank holds) from a GGUF file, with each matrix's
//! kernel chosen and, where asked, quantized at load.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::Device;

use crate::model::gguf::GgufFile;
use crate::model::quantize::{self, Quantize, Quantized, Site};
use crate::model::shard::{self, LayerShard, Partition, TensorSpec};
use crate::model::{ModelError, Precision};

use super::*;

impl Llama {
    /// Builds the whole model from a parsed GGUF file, loading every weight once.
    pub fn from_gguf(g: &GgufFile, precision: Precision) -> Result<Self> {
        let config = LlamaConfig::from_gguf(g)?;
        let part = Partition::full(config.n_layers);
        Self::from_gguf_part(g, precision, &part)
    }

    /// Builds the part of the model that `part` names: only its tensors are read.
    pub fn from_gguf_part(g: &GgufFile, precision: Precision, part: &Partition) -> Result<Self> {
        Self::load(g, precision, part, None, &Device::Cpu)
    }

    /// [`Self::from_gguf_part`] on `device`, quantizing the weights at load when `quantize`
    /// is given.
    pub fn load(
        g: &GgufFile,
        precision: Precision,
        part: &Partition,
        quantize: Option<Quantize>,
        device: &Device,
    ) -> Result<Self> {
        Self::load_with_kernels(
            g,
            precision,
            part,
            quantize,
            device,
            Kernels::for_device(device),
        )
    }

    /// [`Self::load`] with the forward pass's code chosen ([`Kernels::Own`] is taken as
    /// [`Kernels::Candle`] off the CPU).
    pub fn load_with_kernels(
        g: &GgufFile,
        precision: Precision,
        part: &Partition,
        quantize: Option<Quantize>,
        device: &Device,
        kernels: Kernels,
    ) -> Result<Self> {
        let kernels = if device.is_cpu() {
            kernels
        } else {
            Kernels::Candle
        };
        let config = LlamaConfig::from_gguf(g)?;
        shard::check_tensor_parallel(g, &config, part.tp, quantize.as_ref())?;
        let (v, d) = (config.vocab_size, config.hidden_size);
        let vocab = part.tp_range(v);
        let embd_spec = TensorSpec {
            rows: vocab.clone(),
            ..TensorSpec::whole("token_embd.weight".into(), &[v, d])
        };
        let need_embd = part.embed || (part.head && config.tied_embeddings);
        let embd_raw = if need_embd {
            Some(shard::read(g, &embd_spec)?)
        } else {
            None
        };
        let full_vocab = v;
        let (mut embedding, mut output) = (None, None);
        let quant_embd = quantize.filter(|q| q.covers_embeddings(config.tied_embeddings));
        let quant_out = quantize.filter(|q| q.output);
        // A tied output layer on our kernels is built from the file's bytes (in place for
        // BF16/F32), and its rows serve the lookups: no candle copy of the table is made.
        if let Some(raw) = &embd_raw {
            if part.head
                && config.tied_embeddings
                && quant_out.is_none()
                && own_kernels(precision, kernels)
            {
                output = Linear::own(raw, "token_embd.weight", precision)?;
            }
        }
        let tied_own = match &output {
            Some(Linear::Own(m)) if part.embed && quant_embd.is_none() => Some(m.clone()),
            _ => None,
        };
        // An untied table of a type read as another (IQ4_NL, IQ4_XS) stays in its stored form
        // in our kernel, whose rows serve the lookups: candle's form of IQ4_XS is F32, 7.5
        // times the bytes.
        let table_own = match &embd_raw {
            Some(raw)
                if tied_own.is_none()
                    && part.embed
                    && quant_embd.is_none()
                    && raw.stored.is_some()
                    && precision == Precision::Native
                    && own_kernels(precision, kernels) =>
            {
                match Linear::own(raw, "token_embd.weight", precision)? {
                    Some(Linear::Own(m)) => Some(m),
                    _ => None,
                }
            }
            _ => tied_own,
        };
        let tied_head_on_candle = output.is_none() && part.head && config.tied_embeddings;
        let embd = match &embd_raw {
            Some(raw) if tied_head_on_candle || (part.embed && table_own.is_none()) => {
                // On the host first: several layouts derive from it, each placed on `device`.
                Some(Arc::new(qtensor(raw, "token_embd.weight", &Device::Cpu)?))
            }
            _ => None,
        };
        if let Some(raw) = embd_raw {
            release(g, &raw, "token_embd.weight");
        }
        if let Some(m) = table_own {
            embedding = Some(EmbeddingTable::Own(m));
        }
        // A tied table follows the output layer's type (as llama.cpp's quantizer).
        let embd_site = Site {
            name: "token_embd.weight",
            n_layers: config.n_layers,
            output: config.tied_embeddings,
        };
        if let Some(embd) = &embd {
            // Quantized at load (`--quantize` with embeddings/output): from the f32 values.
            let requantized = |q: &Quantize| -> Result<EmbeddingTable> {
                let w = embd.dequantize(&Device::Cpu)?;
                match quantize::quantize(q, &w, &embd_site).map_err(|e| ModelError::Tensor {
                    name: "token_embd.weight".into(),
                    detail: format!("cannot quantize it to {}: {e}", q.scheme),
                })? {
                    Quantized::Dense(t) => Ok(EmbeddingTable::Dense(
                        t.to_dtype(precision.dtype())?.to_device(device)?,
                    )),
                    // Lookups of a quantized table give f32 rows: dense in bf16/f16.
                    Quantized::Ggml(qt)
                        if matches!(precision, Precision::Bf16 | Precision::F16) =>
                    {
                        Ok(EmbeddingTable::Dense(dense(&qt, precision, device)?))
                    }
                    Quantized::Ggml(qt) => {
                        Ok(EmbeddingTable::Quantized(place_qtensor(qt, device)?))
                    }
                }
            };
            if part.head && config.tied_embeddings && output.is_none() {
                output = Some(match (quant_out, precision) {
                    (Some(q), _) => {
                        let raw = shard::read(g, &embd_spec)?;
                        Linear::quantized(&raw, &embd_site, precision, device, kernels, &q)?
                    }
                    (None, Precision::Native) => Linear::from_qtensor(
                        embd.clone(),
                        embd_site.name,
                        precision,
                        device,
                        kernels,
                    )?,
                    (None, p) => Linear::Candle(QMatMul::Tensor(dense(embd, p, device)?)),
                });
            }
            if part.embed && embedding.is_none() {
                embedding = Some(match (quant_embd, precision) {
                    (Some(q), _) => requantized(&q)?,
                    (None, Precision::Native) => {
                        // The tied output layer's decoded rows serve the lookups too.
                        let tied = output
                            .as_ref()
                            .filter(|_| config.tied_embeddings && quant_out.is_none());
                        if let Some(Linear::Own(m)) = tied {
                            EmbeddingTable::Own(m.clone())
                        } else if let Some(Linear::Candle(QMatMul::QTensor(q))) =
                            tied.filter(|_| kernels == Kernels::Candle)
                        {
                            // The output layer's copy on the GPU serves the lookups too.
                            EmbeddingTable::Quantized(q.clone())
                        } else if let Some(Linear::Candle(QMatMul::Tensor(t))) =
                            tied.filter(|_| embd.dtype() == GgmlDType::F32)
                        {
                            // An F32 table: the output layer's dense copy serves the lookups.
                            EmbeddingTable::Dense(t.clone())
                        } else if let Some(m) = own_table(embd, kernels)? {
                            // F16/BF16 stay 16-bit: rows decoded as they are looked up.
                            EmbeddingTable::Own(m)
                        } else if embd.dtype().block_size() == 1 {
                            EmbeddingTable::Dense(dense(embd, Precision::F32, device)?)
                        } else {
                            EmbeddingTable::Quantized(place_qtensor(embd.clone(), device)?)
                        }
                    }
                    (None, p) => {
                        // Shares the output layer's dense copy when tied and both are here.
                        match &output {
                            Some(Linear::Candle(QMatMul::Tensor(t)))
                                if config.tied_embeddings && quant_out.is_none() =>
                            {
                                EmbeddingTable::Dense(t.clone())
                            }
                            _ => EmbeddingTable::Dense(dense(embd, p, device)?),
                        }
                    }
                });
            }
        }
        drop(embd);
        if part.head && !config.tied_embeddings {
            let spec = TensorSpec {
                rows: vocab.clone(),
                ..TensorSpec::whole("output.weight".into(), &[v, d])
            };
            let raw = shard::read(g, &spec)?;
            output = Some(match quant_out {
                Some(q) => {
                    let site = Site {
                        name: "output.weight",
                        n_layers: config.n_layers,
                        output: true,
                    };
                    Linear::quantized(&raw, &site, precision, device, kernels, &q)?
                }
                None => Linear::from_raw(&raw, "output.weight", precision, device, kernels)?,
            });
            release(g, &raw, "output.weight");
        }
        let layers = part
            .layers
            .clone()
            .map(|i| {
                let raws = shard::block_specs(&config, i, part).try_map(|s| shard::read(g, &s))?;
                let layer = if part.fsdp > 1 {
                    Layer::Sharded(LayerShard::new(&raws, part.fsdp_rank, part.fsdp))
                } else {
                    Layer::Resident(Box::new(Block::from_raw(
                        &config,
                        i,
                        part,
                        &raws,
                        Compute {
                            precision,
                            device,
                            kernels,
                        },
                        quantize.as_ref(),
                    )?))
                };
                for raw in raws.iter() {
                    release(g, raw, &raw.name);
                }
                Ok(layer)
            })
            .collect::<Result<Vec<_>>>()?;
        let freq_factors = match g.tensors.get("rope_freqs.weight") {
            Some(_) => Some(
                g.qtensor("rope_freqs.weight", &[config.rope_dim / 2], &Device::Cpu)?
                    .dequantize(&Device::Cpu)?
                    .to_vec1::<f32>()?,
            ),
            // A checkpoint's configured scaling, as the reader recorded it.
            None => match g.get(&format!(
                "{}.{}",
                config.arch.gguf_name(),
                crate::model::rope_scaling::FREQ_FACTORS_KEY
            )) {
                Some(crate::model::gguf::Value::Array(v)) => Some(
                    v.iter()
                        .map(|x| match x {
                            crate::model::gguf::Value::F32(f) => *f,
                            _ => 1.0,
                        })
                        .collect(),
                ),
                _ => None,
            },
        };
        let norm = if part.head {
            Some(RmsNorm::load(g, "output_norm.weight", &config, device)?)
        } else {
            None
        };
        Ok(Self {
            rope_local: match config.local_layers.is_empty() {
                false => Some(Rope::new(&config, config.rope_theta_local, None, device)?),
                true => None,
            },
            rope: Rope::new(&config, config.rope_theta, freq_factors, device)?,
            embedding: embedding.map(|table| Embedding {
                table,
                vocab: vocab.clone(),
                full_vocab,
            }),
            output_vocab: if part.head { vocab } else { 0..0 },
            config,
            partition: part.clone(),
            precision,
            layers,
            norm,
            output,
            quantize,
            device: device.clone(),
            kernels,
        })
    }
}
