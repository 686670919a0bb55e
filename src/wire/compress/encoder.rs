//! Streaming encoders for response compression: gzip (zlib-ng through
//! `flate2`, the build Pingora already links), brotli (the `brotli` crate)
//! and zstd (libzstd through `zstd`). Each chunk the shard sends is
//! compressed and flushed at once (a sync flush), so that a streamed
//! body reaches the client as it is produced; the last call ends the
//! stream. Windows are bounded for an edge: memory per stream is the
//! encoder's state (measured in docs/compression.md) plus the chunk in
//! flight.

use super::Coding;
use bytes::Bytes;
use std::io::{self, Write};

/// zstd's and brotli's window: 2¹⁶ bytes (deflate's is 2¹⁵), far below
/// their defaults (zstd's level 3 asks 2 MiB, brotli 4 MiB); documents
/// of ~100 KiB compress as well with it (docs/compression.md).
const WINDOW_LOG: u32 = 16;

/// zstd's match tables (level 3 asks 2¹⁷ and 2¹⁶ entries): with the
/// window, a stream's context is ~650 KiB instead of 1.8 MiB.
const ZSTD_HASH_LOG: u32 = 15;
const ZSTD_CHAIN_LOG: u32 = 14;

/// Brotli's own output buffer.
const BROTLI_BUFFER: usize = 4096;

/// Compression levels (`compression.levels`): fast ones for an edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    /// 1–9.
    pub gzip: u32,
    /// 0–11.
    pub br: u32,
    /// 1–19.
    pub zstd: i32,
}

impl Default for Levels {
    /// gzip 4, brotli 4, zstd 3: fast levels, each near its best ratio
    /// for text at a fraction of the CPU (see docs/compression.md).
    fn default() -> Self {
        Levels {
            gzip: 4,
            br: 4,
            zstd: 3,
        }
    }
}

enum Inner {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
    /// Finished: nothing more may come.
    Done,
}

/// One response body's encoder.
pub struct Encoder {
    inner: Inner,
}

impl Encoder {
    pub fn new(coding: Coding, levels: Levels) -> io::Result<Encoder> {
        let inner = match coding {
            Coding::Gzip => {
                let level = flate2::Compression::new(levels.gzip.min(9));
                Inner::Gzip(flate2::write::GzEncoder::new(Vec::new(), level))
            }
            Coding::Br => {
                let quality = levels.br.min(11);
                let writer =
                    brotli::CompressorWriter::new(Vec::new(), BROTLI_BUFFER, quality, WINDOW_LOG);
                Inner::Br(Box::new(writer))
            }
            Coding::Zstd => {
                let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), levels.zstd)?;
                encoder.window_log(WINDOW_LOG)?;
                encoder.set_parameter(zstd::stream::raw::CParameter::HashLog(ZSTD_HASH_LOG))?;
                encoder.set_parameter(zstd::stream::raw::CParameter::ChainLog(ZSTD_CHAIN_LOG))?;
                encoder.include_checksum(false)?;
                Inner::Zstd(encoder)
            }
        };
        Ok(Encoder { inner })
    }

    /// Compresses `input` and flushes: the bytes returned, with those
    /// before, decode to everything given so far.
    pub fn chunk(&mut self, input: &[u8]) -> io::Result<Bytes> {
        match &mut self.inner {
            Inner::Gzip(e) => write_flushed(e, input),
            Inner::Br(e) => write_flushed(e.as_mut(), input),
            Inner::Zstd(e) => write_flushed(e, input),
            Inner::Done => Err(io::Error::other("the compressed stream has ended")),
        }?;
        Ok(self.take())
    }

    /// Ends the stream: its last bytes (a trailer, an end mark).
    pub fn finish(&mut self) -> io::Result<Bytes> {
        match std::mem::replace(&mut self.inner, Inner::Done) {
            Inner::Gzip(mut e) => {
                e.try_finish()?;
                Ok(std::mem::take(e.get_mut()).into())
            }
            Inner::Br(e) => Ok(e.into_inner().into()),
            Inner::Zstd(mut e) => {
                e.do_finish()?;
                Ok(std::mem::take(e.get_mut()).into())
            }
            Inner::Done => Ok(Bytes::new()),
        }
    }

    /// The output so far, taken out of the encoder's buffer.
    fn take(&mut self) -> Bytes {
        let out = match &mut self.inner {
            Inner::Gzip(e) => e.get_mut(),
            Inner::Br(e) => e.get_mut(),
            Inner::Zstd(e) => e.get_mut(),
            Inner::Done => return Bytes::new(),
        };
        std::mem::take(out).into()
    }
}

fn write_flushed(w: &mut impl Write, input: &[u8]) -> io::Result<()> {
    w.write_all(input)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn decode(coding: Coding, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match coding {
            Coding::Gzip => flate2::read::GzDecoder::new(bytes)
                .read_to_end(&mut out)
                .map(|_| ()),
            Coding::Br => brotli::Decompressor::new(bytes, 4096)
                .read_to_end(&mut out)
                .map(|_| ()),
            Coding::Zstd => zstd::stream::copy_decode(bytes, &mut out),
        }
        .expect("decodes");
        out
    }

    /// Text that compresses as HTML does.
    fn page(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| format!("<li class=\"item\">entry {i} of the list</li>\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn every_chunk_decodes_as_soon_as_it_is_sent() {
        for coding in [Coding::Gzip, Coding::Br, Coding::Zstd] {
            let mut encoder = Encoder::new(coding, Levels::default()).expect("encoder");
            let mut sent = Vec::new();
            let mut given = Vec::new();
            for part in [page(10), page(200), b"x".to_vec(), page(3)] {
                given.extend_from_slice(&part);
                sent.extend_from_slice(&encoder.chunk(&part).expect("chunk"));
                // What was sent so far decodes to what was given so far
                // (a streaming decoder would not wait for the end).
                let mut partial = Vec::new();
                let read = match coding {
                    Coding::Gzip => {
                        flate2::read::MultiGzDecoder::new(&sent[..]).read_to_end(&mut partial)
                    }
                    Coding::Br => {
                        brotli::Decompressor::new(&sent[..], 4096).read_to_end(&mut partial)
                    }
                    Coding::Zstd => {
                        let mut d = zstd::stream::read::Decoder::new(&sent[..]).expect("decoder");
                        d.read_to_end(&mut partial)
                    }
                };
                // The stream is not ended: a reader may say so at its end,
                // after it gave every byte.
                let _ = read;
                assert_eq!(partial, given, "{coding:?} after {} bytes", given.len());
            }
            sent.extend_from_slice(&encoder.finish().expect("finish"));
            assert_eq!(decode(coding, &sent), given, "{coding:?}");
            assert!(
                sent.len() * 4 < given.len(),
                "{coding:?}: {} → {}",
                given.len(),
                sent.len()
            );
            assert!(encoder.chunk(b"late").is_err(), "ended");
            assert!(encoder.finish().expect("again").is_empty());
        }
    }

    #[test]
    fn an_empty_body_is_a_valid_stream() {
        for coding in [Coding::Gzip, Coding::Br, Coding::Zstd] {
            let mut encoder = Encoder::new(coding, Levels::default()).expect("encoder");
            let sent = encoder.finish().expect("finish");
            assert!(decode(coding, &sent).is_empty(), "{coding:?}");
        }
    }
}
