//! Every page header of a Parquet file, checked before parquet-rs decodes the file.
//!
//! parquet-rs 60 reserves a page's declared uncompressed size (`Vec::with_capacity`) before it
//! decompresses the page, so a 9 KB file whose page header claims 2^31 - 1 bytes made every
//! reader of states or receipts ask for 2 GiB (found by `decision-fuzz states-parquet`; where
//! memory is committed on allocation, that is an abort, not an error). Its header types are
//! private, so this module reads the headers itself: each column chunk's byte range from the
//! footer, then page after page the Thrift compact `PageHeader` (fields 2 and 3, the
//! uncompressed and compressed sizes; everything else skipped), refusing a page that claims
//! more than [`MAX_PAGE_BYTES`]. Writers make pages of about 1 MiB (pyarrow, parquet-rs, Spark).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};

use anyhow::{Result, bail};
use parquet::file::metadata::ParquetMetaData;

/// The largest uncompressed page accepted: 256 times the usual 1 MiB.
pub const MAX_PAGE_BYTES: i64 = 256 << 20;

/// Check the pages of `row_groups` (all when `None`) of the file `md` describes.
pub(crate) fn check_pages(
    file: &File,
    md: &ParquetMetaData,
    row_groups: Option<&[usize]>,
) -> Result<()> {
    let file_len = file.metadata()?.len() as i64;
    let all: Vec<usize> = (0..md.num_row_groups()).collect();
    let mut r = BufReader::with_capacity(8 << 10, file);
    for &g in row_groups.unwrap_or(&all) {
        if g >= md.num_row_groups() {
            continue;
        }
        for (c, col) in md.row_group(g).columns().iter().enumerate() {
            let start = match col.dictionary_page_offset() {
                Some(d) if d > 0 && d < col.data_page_offset() => d,
                _ => col.data_page_offset(),
            };
            let len = col.compressed_size();
            let end = start.checked_add(len).unwrap_or(-1);
            if start < 0 || len < 0 || end > file_len || end < 0 {
                bail!(
                    "row group {g}, column {c}: the footer puts its pages at bytes {start}..+{len} \
                     of a {file_len}-byte file"
                );
            }
            let mut pos = start;
            while pos < end {
                r.seek(SeekFrom::Start(pos as u64))?;
                let mut header = Compact {
                    r: (&mut r).take((end - pos) as u64),
                    read: 0,
                };
                let (uncompressed, compressed) = header.page_sizes().map_err(|e| {
                    anyhow::anyhow!("row group {g}, column {c}: page header at byte {pos}: {e}")
                })?;
                if uncompressed > MAX_PAGE_BYTES {
                    bail!(
                        "row group {g}, column {c}: the page at byte {pos} claims {uncompressed} \
                         bytes uncompressed (at most {MAX_PAGE_BYTES} are read; writers make pages \
                         of about 1 MiB)"
                    );
                }
                match (pos + header.read as i64).checked_add(compressed) {
                    Some(next) if next <= end => pos = next,
                    _ => bail!(
                        "row group {g}, column {c}: the page at byte {pos} claims {compressed} \
                         compressed bytes, past its column chunk (which ends at byte {end})"
                    ),
                }
            }
        }
    }
    Ok(())
}

/// A Thrift compact-protocol reader that counts the bytes it takes.
struct Compact<R: Read> {
    r: R,
    read: usize,
}

/// Nesting deeper than this in a page header is refused (real headers nest three levels).
const MAX_DEPTH: u32 = 32;

impl<R: Read> Compact<R> {
    fn byte(&mut self) -> Result<u8> {
        let mut b = [0u8];
        if self.r.read(&mut b)? == 0 {
            bail!("the header runs past its column chunk");
        }
        self.read += 1;
        Ok(b[0])
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift.min(63);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        bail!("a varint longer than 10 bytes")
    }

    fn zigzag(&mut self) -> Result<i64> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn skip_bytes(&mut self, n: u64) -> Result<()> {
        let got = std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink())?;
        if got != n {
            bail!("the header runs past its column chunk");
        }
        self.read += n as usize;
        Ok(())
    }

    /// Skip one value of compact type `ty`; `in_field` says whether a bool's value is in the
    /// field header (struct fields) or a byte of its own (collection elements).
    fn skip(&mut self, ty: u8, in_field: bool, depth: u32) -> Result<()> {
        if depth > MAX_DEPTH {
            bail!("nested past {MAX_DEPTH} levels");
        }
        match ty {
            1 | 2 if in_field => Ok(()),
            1..=3 => self.byte().map(drop),
            4..=6 => self.varint().map(drop),
            7 => self.skip_bytes(8),
            8 => {
                let n = self.varint()?;
                self.skip_bytes(n)
            }
            9 | 10 => {
                let b = self.byte()?;
                let n = match b >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                for _ in 0..n {
                    self.skip(b & 0x0f, false, depth + 1)?;
                }
                Ok(())
            }
            11 => {
                let n = self.varint()?;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.skip(kv >> 4, false, depth + 1)?;
                        self.skip(kv & 0x0f, false, depth + 1)?;
                    }
                }
                Ok(())
            }
            12 => self.fields(depth + 1, &mut |_, _, _| Ok(false)),
            other => bail!("unknown Thrift type {other}"),
        }
    }

    /// Read a struct's fields to its stop byte; `take(id, ty, self)` reads a field it wants and
    /// returns true, else the field is skipped.
    fn fields(
        &mut self,
        depth: u32,
        take: &mut dyn FnMut(i16, u8, &mut Self) -> Result<bool>,
    ) -> Result<()> {
        let mut id: i16 = 0;
        loop {
            let b = self.byte()?;
            if b == 0 {
                return Ok(());
            }
            let ty = b & 0x0f;
            id = match b >> 4 {
                0 => self.zigzag()? as i16,
                delta => id.wrapping_add(i16::from(delta)),
            };
            if !take(id, ty, self)? {
                self.skip(ty, true, depth)?;
            }
        }
    }

    /// `PageHeader`'s uncompressed (field 2) and compressed (field 3) sizes, both required.
    fn page_sizes(&mut self) -> Result<(i64, i64)> {
        let (mut uncompressed, mut compressed) = (None, None);
        self.fields(0, &mut |id, ty, s| match (id, ty) {
            (2, 5) => s.zigzag().map(|v| uncompressed = Some(v)).map(|_| true),
            (3, 5) => s.zigzag().map(|v| compressed = Some(v)).map(|_| true),
            _ => Ok(false),
        })?;
        let i32_range = 0..=i64::from(i32::MAX);
        match (uncompressed, compressed) {
            (Some(u), Some(c)) if i32_range.contains(&u) && i32_range.contains(&c) => Ok((u, c)),
            (Some(u), Some(c)) => {
                bail!("page sizes outside 0..2^31 ({u} uncompressed, {c} compressed; they are i32)")
            }
            _ => bail!("no page sizes (not a page header)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(bytes: &[u8]) -> Result<(i64, i64, usize)> {
        let mut c = Compact { r: bytes, read: 0 };
        let s = c.page_sizes()?;
        Ok((s.0, s.1, c.read))
    }

    /// A header as parquet-rs writes one: type DATA_PAGE (0), sizes 100 / 60, a data page
    /// header struct (field 5) with a nested statistics struct holding a binary, then stop.
    #[test]
    fn page_sizes_are_read_and_the_rest_skipped() {
        let header = [
            0x15, 0x00, // field 1 i32: 0
            0x15, 0xc8, 0x01, // field 2 i32: zigzag 200 = 100
            0x15, 0x78, // field 3 i32: zigzag 120 = 60
            0x2c, // field 5 struct
            0x15, 0x04, // num_values = 2
            0x5c, // field 5 struct (statistics)
            0x18, 0x02, b'a', b'b', // binary "ab"
            0x11, // bool true in the field header
            0x19, 0x25, 0x02, 0x04, // list of 2 i32
            0x00, // end statistics
            0x00, // end data page header
            0x00, // end page header
            0xff, // the page's data
        ];
        assert_eq!(sizes(&header).unwrap(), (100, 60, header.len() - 1));
    }

    #[test]
    fn bad_headers_are_errors() {
        // a header cut before its stop byte
        assert!(sizes(&[0x15, 0x00, 0x15]).is_err());
        // no sizes
        assert!(sizes(&[0x15, 0x00, 0x00]).is_err());
        // a negative size
        assert!(sizes(&[0x25, 0x01, 0x15, 0x02, 0x00]).is_err());
        // a size past i32 (the varint of 2^40, zigzagged)
        assert!(sizes(&[0x15, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0x15, 0x02, 0x00]).is_err());
        // nesting without end
        let deep = vec![0x1c; 200];
        assert!(sizes(&deep).is_err());
        // an unknown type
        assert!(sizes(&[0x1d, 0x00]).is_err());
    }
}
