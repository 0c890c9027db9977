//! The bill before the run: what an epoch will ask of each layer of the store stack (the
//! local tier, origin) per rank, and what origin will cost at a store's prices; and the same
//! figures from what the meters counted, to set beside it.
//!
//! The prediction runs the reader's own window planning ([`crate::window::Windows`]) over each
//! rank's and worker's plan without reading: the same requests a stream would submit, each
//! with the layer its chunk opens in now (with peers, the node's that keeps it). It does not
//! foresee chunks admitted to the tier during the epoch and read again in it, hot chunks, and
//! peers that do not hold their chunks yet or do not answer. An object store serves each range
//! in parts of at most [`granary_store::object::GET_PART`] bytes, one GET each.

use std::sync::Arc;

use serde::Serialize;

use crate::dataset::Dataset;
use crate::epoch::{EpochSetup, LayerReading};
use crate::error::{ReadError, Result};
use crate::plan::Shard;
use crate::window::Windows;
use granary_store::Access;

/// What an origin store charges (in any currency): per 1,000 requests (GETs) and per GB read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Prices {
    pub per_1000_requests: f64,
    pub per_gb: f64,
}

impl Prices {
    /// `requests` GETs and `bytes` bytes at these prices.
    pub fn cost(&self, requests: u64, bytes: u64) -> f64 {
        requests as f64 / 1000.0 * self.per_1000_requests + bytes as f64 / 1e9 * self.per_gb
    }

    /// `PER_1000_REQUESTS,PER_GB` (e.g. `0.0004,0.09`), or a file of lines `per_1000_requests
    /// = 0.0004` and `per_gb = 0.09` (`#` starts a comment) when `spec` names one (`@FILE`).
    pub fn parse(spec: &str) -> Result<Prices> {
        let bad = |m: String| ReadError::invalid(m);
        let num = |k: &str, v: &str| -> Result<f64> {
            let x: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad(format!("price {k} {v:?} is not a number")))?;
            if !(x.is_finite() && x >= 0.0) {
                return Err(bad(format!("price {k} {v} is not a price (0 or more)")));
            }
            Ok(x)
        };
        let Some(file) = spec.strip_prefix('@') else {
            let (r, g) = spec.split_once(',').ok_or_else(|| {
                bad(format!(
                    "prices {spec:?}: give PER_1000_REQUESTS,PER_GB (e.g. 0.0004,0.09) or @FILE"
                ))
            })?;
            return Ok(Prices {
                per_1000_requests: num("per 1000 requests", r)?,
                per_gb: num("per GB", g)?,
            });
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| ReadError::io("reading the prices", file, e))?;
        let (mut req, mut gb) = (None, None);
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| bad(format!("{file}:{}: not `name = price`", n + 1)))?;
            let slot = match k.trim() {
                "per_1000_requests" => &mut req,
                "per_gb" => &mut gb,
                name => {
                    return Err(bad(format!(
                        "{file}:{}: unknown price {name:?}: per_1000_requests or per_gb",
                        n + 1
                    )))
                }
            };
            *slot = Some(num(k, v)?);
        }
        match (req, gb) {
            (Some(per_1000_requests), Some(per_gb)) => Ok(Prices {
                per_1000_requests,
                per_gb,
            }),
            _ => Err(bad(format!("{file}: give per_1000_requests and per_gb"))),
        }
    }
}

/// Requests and bytes one layer serves (`requests`: ranges read, as the meters count them;
/// `gets`: the GETs an object store serves them with).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LayerBill {
    pub layer: &'static str,
    pub requests: u64,
    pub gets: u64,
    pub bytes: u64,
    /// At the prices given (origin only: the tier is this node's own disk).
    pub cost: Option<f64>,
}

/// One rank's share of an epoch's bill.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RankBill {
    pub rank: u32,
    pub layers: Vec<LayerBill>,
}

/// An epoch's bill, predicted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Bill {
    pub epoch: u64,
    pub prices: Option<Prices>,
    pub ranks: Vec<RankBill>,
    /// Every rank's together.
    pub total: Vec<LayerBill>,
}

/// What `layer` costs at `prices` for `gets` GETs and `bytes` bytes: origin's only (the tier
/// is this node's own disk).
fn origin_cost(layer: &str, prices: Option<Prices>, gets: u64, bytes: u64) -> Option<f64> {
    prices
        .filter(|_| layer == "origin")
        .map(|p| p.cost(gets, bytes))
}

fn gets_of(len: u64) -> u64 {
    len.div_ceil(granary_store::object::GET_PART).max(1)
}

/// What reading `ranks` of `epoch` (of `world_size`, `workers` loader workers each) as `setup`
/// says will ask of the tier and origin, per rank, priced at `prices`.
pub fn predict(
    ds: &Arc<Dataset>,
    setup: &EpochSetup,
    epoch: u64,
    ranks: std::ops::Range<u32>,
    world_size: u32,
    workers: u32,
    prices: Option<Prices>,
) -> Result<Bill> {
    let o = setup.plan_options(ds)?;
    let s = &setup.stream;
    let mut bill = Bill {
        epoch,
        prices,
        ..Default::default()
    };
    // (requests, GETs, bytes) of the tier, the peers and origin, and their bill: the layers
    // the reader has, priced.
    let mut total = [[0u64; 3]; 3];
    let present = [
        s.tier.is_some(),
        s.tier.is_some() && s.peers.is_some(),
        true,
    ];
    let bills = |t: &[[u64; 3]; 3]| {
        let layers = ["tier", "peers", "origin"].into_iter().zip(t).zip(present);
        let layers = layers.filter(|l| l.1).map(|((layer, t), _)| LayerBill {
            layer,
            requests: t[0],
            gets: t[1],
            bytes: t[2],
            cost: origin_cost(layer, prices, t[1], t[2]),
        });
        layers.collect()
    };
    // Global plans read single records: no tier.
    let tier = s
        .tier
        .clone()
        .filter(|_| o.mode != crate::ShuffleMode::Global);
    let num_workers = workers.max(1);
    for rank in ranks {
        let mut layers = [[0u64; 3]; 3];
        for worker in 0..num_workers {
            let shard = Shard::at((world_size, num_workers), rank * num_workers + worker);
            let plan = setup.plan(ds, epoch, shard, None)?;
            let access = Access {
                dataset_bytes: ds.total_chunk_bytes()?,
                page_cache_bytes: s.page_cache_bytes,
                map_resident: false,
                populate: false,
                ..Access::plain(s.io_mode)
            };
            let stack = ds.stack(access, tier.clone(), None)?;
            let mut w = Windows::new(ds.clone(), stack, o.mode, s.range_gap, tier.is_some());
            for win in &plan.windows {
                for (layer, c, len) in w.predict(&plan.samples[win.range.clone()])? {
                    // A chunk another node keeps comes from its tier (once it holds it).
                    let elsewhere = s
                        .peers
                        .as_ref()
                        .is_some_and(|p| p.ownership().owner(c).is_some_and(|o| o != p.me()));
                    let i = match layer {
                        "tier" => 0,
                        _ if elsewhere => 1,
                        _ => 2,
                    };
                    for (k, n) in [1, gets_of(len), len].into_iter().enumerate() {
                        layers[i][k] += n;
                        total[i][k] += n;
                    }
                }
            }
        }
        bill.ranks.push(RankBill {
            rank,
            layers: bills(&layers),
        });
    }
    bill.total = bills(&total);
    Ok(bill)
}

/// What the meters counted of an epoch, as a bill: each layer's own requests (ranges) and
/// bytes (the meters are nested: the tier's counts what the layers below served too), origin
/// priced at `prices` with its ranges as GETs.
pub fn measured(layers: &[LayerReading], prices: Option<Prices>) -> Vec<LayerBill> {
    layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let below = layers.get(i + 1).map(|b| b.reading).unwrap_or_default();
            let r = l.reading.ranges.saturating_sub(below.ranges);
            let b = l.reading.bytes.saturating_sub(below.bytes);
            LayerBill {
                layer: l.layer,
                requests: r,
                gets: r,
                bytes: b,
                cost: origin_cost(l.layer, prices, r, b),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_parse_and_refuse() {
        let p = Prices::parse("0.0004,0.09").unwrap();
        assert_eq!(p.per_gb, 0.09);
        assert!((p.cost(10_000, 2_000_000_000) - (0.004 + 0.18)).abs() < 1e-12);
        for bad in ["0.1", "x,1", "1,-2", "1,nan"] {
            assert!(Prices::parse(bad).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.txt");
        std::fs::write(
            &f,
            "# S3 standard\nper_1000_requests = 0.0004\nper_gb = 0.09 # out\n",
        )
        .unwrap();
        let at = format!("@{}", f.display());
        assert_eq!(Prices::parse(&at).unwrap(), p);
        std::fs::write(&f, "per_gb = 0.09\n").unwrap();
        assert!(Prices::parse(&at)
            .unwrap_err()
            .to_string()
            .contains("give per_1000_requests"));
        std::fs::write(&f, "per_tb = 1\n").unwrap();
        assert!(Prices::parse(&at)
            .unwrap_err()
            .to_string()
            .contains("unknown price"));
    }
}
