//! `fedfuse`: run federated experiments, fetch datasets.

/// `println!` for the binary's output: when stdout's reader has gone (`fedfuse groups ... |
/// head`), the process ends quietly with success, as Unix tools do, instead of panicking on
/// the broken pipe.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` likewise.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_out(format_args!($($arg)*))
    };
}

mod bench;
mod cli;
mod data_cmd;
mod fuse_cmd;
mod node_cmd;
mod progress;

use std::process::ExitCode;

use clap::Parser;

/// Model-sized buffers (hundreds of KB) come and go for every client message; glibc serves
/// them with fresh mmaps and page faults, mimalloc reuses them (1.8x more simulated client
/// updates per second, docs/BENCHMARKS.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in the C library's `mi_option_e` (mimalloc.h of the version
/// libmimalloc-sys 0.1.49 builds; its Rust bindings leave this one out).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Writes to stdout; a reader that has gone ends the process with success, any other write
/// error with failure (there is nowhere left to report to but stderr).
fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: could not write to stdout: {e}");
        std::process::exit(1);
    }
}

fn main() -> ExitCode {
    // Training allocates and frees the same large activation buffers every step; returning
    // them to the OS made every step fault them back in, zeroed (-6 to -11% CPU time on conv
    // nets, docs/BENCHMARKS.md). Freed memory stays with the process instead.
    // SAFETY: sets one option of the allocator, before any thread of ours exists.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    let args = cli::Args::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
