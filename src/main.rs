//! `granary`: pack millions of small files into checksummed chunks, inspect, verify and
//! restore them, and benchmark the difference. Thin over the library crates.
#![forbid(unsafe_code)]

/// A subcommand enum, and the function (`$run`) that runs each variant's arguments with the
/// function given beside it.
macro_rules! subcommands {
    ($enum:ident, $run:ident, $($(#[$meta:meta])* $name:ident($args:ty) => $f:expr,)*) => {
        #[derive(clap::Subcommand)]
        enum $enum {
            $($(#[$meta])* $name($args),)*
        }

        fn $run(command: $enum) -> anyhow::Result<std::process::ExitCode> {
            match command {
                $($enum::$name(a) => $f(a),)*
            }
        }
    };
}

mod cmd;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use granary_store::object::parse_seconds;

#[derive(Parser)]
#[command(
    name = "granary",
    version,
    long_version = long_version(),
    about = "Pack millions of small files into large checksummed chunks; read them fast.",
    long_about = "granary turns a directory of many small files (an ImageFolder tree, say) into a \
dataset: a few large chunk files plus one immutable metadata snapshot that answers every \
lookup locally. Every record carries a CRC-32 of its original bytes.",
    after_help = "Examples:\n  granary pack ./train -o train.granary\n  granary info train.granary\n  \
granary append train.granary ./new-files\n  \
granary verify train.granary\n  granary cat train.granary cat/0001.jpg > 0001.jpg\n  \
granary extract train.granary -o ./restored\n  granary read train.granary --epochs 2 --workers 2\n  \
granary mount train.granary /mnt/train\n  \
granary bench compare --raw ./train --packed train.granary --report report/\n\nExit codes: 0 success; 1 error (or, for verify, \
damage found); 2 usage error; 3 pack finished but skipped unreadable files, or verify found a \
dataset of format 1.x (granary upgrade reads it); 4 verify could not look at everything."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,

    /// Seconds to wait for a connection before the attempt fails (and is
    /// retried) [default: 10]
    #[arg(long, global = true, value_name = "SECS", env = "GRANARY_CONNECT_TIMEOUT",
          value_parser = parse_seconds, help_heading = "Object stores")]
    connect_timeout: Option<Duration>,

    /// Seconds a request may go without receiving a byte (the answer, or the
    /// next part of its body) before it fails and is retried; a slow transfer that keeps
    /// moving is never cut off [default: 60]
    #[arg(long, global = true, value_name = "SECS", env = "GRANARY_REQUEST_TIMEOUT",
          value_parser = parse_seconds, help_heading = "Object stores")]
    request_timeout: Option<Duration>,

    /// Seconds to keep retrying a failed request (with backoff, counted from
    /// its first attempt) before the command fails naming the URL [default: 120]
    #[arg(long, global = true, value_name = "SECS", env = "GRANARY_RETRY_TIMEOUT",
          value_parser = parse_seconds, help_heading = "Object stores")]
    retry_timeout: Option<Duration>,
}

subcommands! {
    Command, dispatch,
    Pack(cmd::pack::Args) => cmd::pack::run,
    Merge(cmd::merge::Args) => cmd::merge::run,
    Append(cmd::append::Args) => cmd::append::run,
    Info(cmd::info::Args) => cmd::info::run,
    Ls(cmd::ls::Args) => cmd::ls::run,
    Cat(cmd::cat::Args) => cmd::cat::run,
    Extract(cmd::extract::Args) => cmd::extract::run,
    Verify(cmd::verify::Args) => cmd::verify::run,
    Read(Box<cmd::read::Args>) => |a: Box<_>| cmd::read::run(*a),
    Plan(cmd::plan::Args) => cmd::plan::run,
    Reindex(cmd::reindex::Args) => cmd::reindex::run,
    Upgrade(cmd::upgrade::Args) => cmd::upgrade::run,
    View(cmd::view::Args) => cmd::view::run,
    Delete(cmd::delete::Args) => cmd::delete::run,
    Compact(cmd::compact::Args) => cmd::compact::run,
    Cache(cmd::cache::Args) => cmd::cache::run,
    Mount(cmd::mount::Args) => cmd::mount::run,
    Serve(cmd::serve::Args) => cmd::serve::run,
    Umount(cmd::mount::UmountArgs) => cmd::mount::umount,
    Bench(cmd::bench::Args) => cmd::bench::run,
}

/// The libraries' diagnostics (warnings about a full tier, a peer marked down, a mount's
/// failed read) on standard error, as `granary: warning: ...`. The FUSE library's own
/// warnings are its bookkeeping (an unmount it retries after `granary umount` did it), not the
/// user's: only its errors are shown.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        let most = match m.target().starts_with("fuser") {
            true => log::Level::Error,
            false => log::Level::Warn,
        };
        m.level() <= most
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let level = match r.level() {
                log::Level::Error => "error",
                _ => "warning",
            };
            eprintln!("granary: {level}: {}", r.args());
        }
    }

    fn flush(&self) {}
}

fn main() -> ExitCode {
    static LOG: StderrLog = StderrLog;
    if log::set_logger(&LOG).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    // `println!` panics when stdout is a pipe closed early (`granary plan DS | head`): such a
    // panic is not reported, and the command ends as one that met the closed pipe in a write
    // it checks (below), after its destructors ran.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = (payload.downcast_ref::<String>().map(String::as_str))
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            CLOSED_STDOUT.store(true, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        default_hook(info)
    }));
    let cli = Cli::parse();
    // The store's configuration, resolved once: defaults, the GRANARY_* variables, then the
    // options given here (which clap also takes from their variables).
    let mut store = match granary::StoreConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("granary: error: {e}");
            return ExitCode::from(2);
        }
    };
    let t = &mut store.timeouts;
    t.connect = cli.connect_timeout.unwrap_or(t.connect);
    t.request = cli.request_timeout.unwrap_or(t.request);
    t.retry = cli.retry_timeout.unwrap_or(t.retry);
    cmd::set_store_config(store);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dispatch(cli.cmd)));
    let res = match res {
        Ok(res) => res,
        Err(_) if CLOSED_STDOUT.load(std::sync::atomic::Ordering::Relaxed) => {
            return ExitCode::SUCCESS
        }
        Err(panic) => std::panic::resume_unwind(panic),
    };
    match res {
        Ok(code) => code,
        Err(e) if cmd::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("granary: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Set when a `println!` met a closed stdout (see `main`).
static CLOSED_STDOUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The error and its causes, "a: b: c", leaving out a cause whose text the message before it
/// already ends with (library errors include their source in their own message).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// What `granary --version` prints: the version (one for the crates, the wheel and this
/// command), the format it writes and reads, and the I/O backends this machine offers.
fn long_version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        use granary_format::SNAPSHOT_MAJOR;
        let uring = match granary::io::uring_available() {
            Ok(()) => "yes".to_owned(),
            Err(why) => format!("no: {why}"),
        };
        format!(
            "{}\nformat: {SNAPSHOT_MAJOR}.0, with feature bits (format/SPEC.md); 1.x datasets: \
             `granary upgrade`\nio_uring: {uring}\npread: yes",
            env!("CARGO_PKG_VERSION")
        )
    })
}
