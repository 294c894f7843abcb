//! `weight.bin`: Core ML's MIL blob storage format, version 2.
//!
//! ```text
//! offset 0    storage header (64 bytes): u32 blob count, u32 version = 2, 56 zero bytes
//! offset 64   blob 0 metadata (64 bytes): u32 sentinel 0xDEADBEEF, u32 dtype code,
//!             u64 data size in bytes, u64 data offset, 40 zero bytes (reserved)
//! offset 128  blob 0 data
//! …           zero padding to the next multiple of 64, blob 1 metadata, blob 1 data, …
//! ```
//!
//! All integers are little-endian. A program's `blobFileValue.offset` is the offset of the blob's
//! *metadata record*, not of its data. The layout is planned first ([`BlobPlan`], offsets only, no
//! data) so the program can name every offset before a byte of weights is read; the data is then
//! streamed one tensor at a time ([`write_blobs`]).

use std::io::Write;

use anyhow::{Context, Result, bail};

use crate::graph::{ConstId, DType, Graph};

/// Alignment of every metadata record and every data block.
pub(crate) const ALIGN: u64 = 64;
/// The first four bytes of every metadata record.
pub(crate) const SENTINEL: u32 = 0xDEAD_BEEF;
/// The storage format version this module writes.
pub const VERSION: u32 = 2;
/// Size of the file header and of each metadata record.
pub(crate) const RECORD: u64 = 64;

/// The blob dtype code of an element type (Apple's `BlobDataType`: Float16 = 1, Float32 = 2).
pub(crate) fn dtype_code(dtype: DType) -> Result<u32> {
    match dtype {
        DType::F16 => Ok(1),
        DType::F32 => Ok(2),
        DType::I64 => bail!("integer tensors are not stored in weight.bin"),
    }
}

/// Where a blob's values come from.
#[derive(Debug, Clone)]
pub(crate) enum BlobSource {
    /// A constant of the graph, read with [`Graph::const_bytes`] when written.
    Const(ConstId),
    /// Values made by the lowering (a linear layer's zero bias), stored as `dtype`.
    Values(Vec<f32>),
}

/// One planned blob: its source, storage type, and where its metadata record and data go.
#[derive(Debug, Clone)]
pub(crate) struct Blob {
    pub source: BlobSource,
    pub dtype: DType,
    /// Offset of the metadata record (what `blobFileValue.offset` names).
    pub offset: u64,
    /// Offset of the data (`offset + 64`).
    pub data_offset: u64,
    pub bytes: u64,
}

/// The layout of `weight.bin`, planned before any data is read.
#[derive(Debug, Default)]
pub(crate) struct BlobPlan {
    blobs: Vec<Blob>,
    end: u64,
}

impl BlobPlan {
    pub fn new() -> Self {
        Self {
            blobs: Vec::new(),
            end: RECORD,
        }
    }

    /// Reserve room for `numel` values of `dtype`; returns the metadata offset.
    pub fn add(&mut self, source: BlobSource, dtype: DType, numel: usize) -> Result<u64> {
        dtype_code(dtype)?;
        let offset = self.end.next_multiple_of(ALIGN);
        let bytes = (numel * dtype.size()) as u64;
        let data_offset = offset + RECORD;
        self.end = data_offset + bytes;
        self.blobs.push(Blob {
            source,
            dtype,
            offset,
            data_offset,
            bytes,
        });
        Ok(offset)
    }

    pub fn blobs(&self) -> &[Blob] {
        &self.blobs
    }
}

/// The 64-byte file header.
pub fn header(count: u32) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[0..4].copy_from_slice(&count.to_le_bytes());
    h[4..8].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// The 64-byte metadata record of a blob.
pub fn metadata(dtype: DType, bytes: u64, data_offset: u64) -> Result<[u8; 64]> {
    let mut m = [0u8; 64];
    m[0..4].copy_from_slice(&SENTINEL.to_le_bytes());
    m[4..8].copy_from_slice(&dtype_code(dtype)?.to_le_bytes());
    m[8..16].copy_from_slice(&bytes.to_le_bytes());
    m[16..24].copy_from_slice(&data_offset.to_le_bytes());
    Ok(m)
}

fn values_bytes(values: &[f32], dtype: DType) -> Result<Vec<u8>> {
    Ok(match dtype {
        DType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => values
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        DType::I64 => bail!("integer tensors are not stored in weight.bin"),
    })
}

/// Stream the planned blobs into `out`, reading each graph constant only when it is written.
/// `progress` is called once per blob.
pub(crate) fn write_blobs(
    plan: &BlobPlan,
    graph: &Graph,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(),
) -> Result<()> {
    let count = u32::try_from(plan.blobs.len()).context("too many weight blobs")?;
    out.write_all(&header(count))?;
    let mut at = RECORD;
    for blob in &plan.blobs {
        let pad = blob.offset - at;
        out.write_all(&vec![0u8; pad as usize])?;
        out.write_all(&metadata(blob.dtype, blob.bytes, blob.data_offset)?)?;
        let data = match &blob.source {
            BlobSource::Const(id) => {
                let c = graph.constant(*id);
                if c.dtype != blob.dtype {
                    bail!(
                        "constant `{}` is stored as {}, the plan says {}",
                        c.name,
                        c.dtype.name(),
                        blob.dtype.name()
                    );
                }
                graph.const_bytes(*id)?
            }
            BlobSource::Values(v) => values_bytes(v, blob.dtype)?,
        };
        if data.len() as u64 != blob.bytes {
            bail!(
                "a weight blob has {} bytes, {} were planned",
                data.len(),
                blob.bytes
            );
        }
        out.write_all(&data)?;
        at = blob.data_offset + blob.bytes;
        progress();
    }
    Ok(())
}

/// What [`read_record`] found at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub dtype_code: u32,
    pub bytes: u64,
    pub data_offset: u64,
}

/// Read and check the metadata record at `offset` of a `weight.bin` image: alignment, sentinel,
/// reserved bytes, and that the data lies inside the file.
pub(crate) fn read_record(file: &[u8], offset: u64) -> Result<Record> {
    if !offset.is_multiple_of(ALIGN) {
        bail!("blob offset {offset} is not a multiple of {ALIGN}");
    }
    let start = offset as usize;
    let Some(m) = file.get(start..start + RECORD as usize) else {
        bail!(
            "blob offset {offset} is past the end of the file ({} bytes)",
            file.len()
        );
    };
    let u32_at = |i: usize| u32::from_le_bytes(m[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(m[i..i + 8].try_into().expect("8 bytes"));
    let sentinel = u32_at(0);
    if sentinel != SENTINEL {
        bail!("blob at offset {offset}: sentinel is {sentinel:#010x}, expected {SENTINEL:#010x}");
    }
    let record = Record {
        dtype_code: u32_at(4),
        bytes: u64_at(8),
        data_offset: u64_at(16),
    };
    if m[24..].iter().any(|b| *b != 0) {
        bail!("blob at offset {offset}: reserved metadata bytes are not zero");
    }
    if record.data_offset < offset + RECORD || !record.data_offset.is_multiple_of(ALIGN) {
        bail!(
            "blob at offset {offset}: data offset {} is not an aligned offset after its metadata",
            record.data_offset
        );
    }
    if record.data_offset + record.bytes > file.len() as u64 {
        bail!(
            "blob at offset {offset}: {} bytes at {} run past the end of the file ({} bytes)",
            record.bytes,
            record.data_offset,
            file.len()
        );
    }
    Ok(record)
}

/// Read and check the file header; returns the blob count.
pub(crate) fn read_header(file: &[u8]) -> Result<u32> {
    let Some(h) = file.get(0..RECORD as usize) else {
        bail!(
            "weight.bin has {} bytes, less than its 64-byte header",
            file.len()
        );
    };
    let count = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes"));
    let version = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
    if version != VERSION {
        bail!("weight.bin has storage version {version}, expected {VERSION}");
    }
    if h[8..].iter().any(|b| *b != 0) {
        bail!("weight.bin: reserved header bytes are not zero");
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_aligns_every_record_and_points_data_after_its_metadata() {
        let mut plan = BlobPlan::new();
        let a = plan
            .add(BlobSource::Values(vec![1.0; 3]), DType::F16, 3)
            .unwrap();
        let b = plan
            .add(BlobSource::Values(vec![2.0; 20]), DType::F32, 20)
            .unwrap();
        let c = plan
            .add(BlobSource::Values(vec![3.0; 1]), DType::F32, 1)
            .unwrap();
        assert_eq!((a, b, c), (64, 192, 384));
        assert_eq!(plan.blobs()[1].data_offset, 256);
        assert_eq!(plan.end, 384 + 64 + 4);
        assert!(plan.add(BlobSource::Values(vec![]), DType::I64, 0).is_err());
    }

    #[test]
    fn records_round_trip_and_corruption_is_named() {
        let mut file = header(1).to_vec();
        file.extend(metadata(DType::F16, 6, 128).unwrap());
        file.extend([0u8; 6]);
        assert_eq!(read_header(&file).unwrap(), 1);
        let r = read_record(&file, 64).unwrap();
        assert_eq!(
            r,
            Record {
                dtype_code: 1,
                bytes: 6,
                data_offset: 128
            }
        );
        assert_eq!(&file[64..68], &[0xEF, 0xBE, 0xAD, 0xDE]);
        let mut bad = file.clone();
        bad[65] ^= 0xFF;
        let err = read_record(&bad, 64).unwrap_err().to_string();
        assert!(err.contains("sentinel"), "{err}");
        assert!(read_record(&file, 32).is_err());
        assert!(
            read_record(&file[..130], 64)
                .unwrap_err()
                .to_string()
                .contains("past the end")
        );
        let mut v1 = file.clone();
        v1[4] = 1;
        assert!(
            read_header(&v1)
                .unwrap_err()
                .to_string()
                .contains("version 1")
        );
    }
}
