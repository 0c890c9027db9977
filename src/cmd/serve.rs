//! `granary serve`: the command line of the peers' server
//! (`granary_store::peers::server`, which documents what it answers and refuses).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use granary_store::peers::server::{PeerServer, ServeConfig};

/// Serve this node's local tier to the other nodes of a training job (read-only HTTP).
#[derive(clap::Args)]
#[command(after_help = "Examples:
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /shared/job.secret   # once per job
  granary serve train.granary --cache-dir /ssd/gcache --listen 10.0.0.7:7070 \\
      --secret-file /shared/job.secret
  # every rank of a 4-node job (the same list everywhere; its node follows from its rank):
  granary read train.granary --cache-dir /ssd/gcache --cache-size 200GiB \\
      --peer-secret-file /shared/job.secret \\
      --peers 10.0.0.5:7070,10.0.0.6:7070,10.0.0.7:7070,10.0.0.8:7070 --rank R --world-size 4

The server answers GET and HEAD for /<dataset id>/chunk-NNNNNNNN-<digest>.gchunk (single byte ranges
supported) from the tier directory of each dataset named, and nothing else: no other dataset,
no other file, no writes. Only the job's own readers are answered: every request carries an
HMAC-SHA256 proof made with the job's secret (--secret-file, or GRANARY_PEER_SECRET; readers
take the same: `granary read --peer-secret-file`, or the variable), bound to the request and to
a 60 s window and never accepted twice; any other request is refused (401 without a proof, 403
with a wrong, stale or replayed one) and logged with the caller's address. The bytes travel in
the clear unless --tls-cert/--tls-key are given (readers then pass --peer-ca): bind a plain
server to the job's internal network. Readers check every chunk they
receive against their snapshot (size and SHA-256 digest), so a damaged or foreign copy is rejected and
read from origin storage instead. The first example makes a secret (Python:
granary.job_secret() makes one on rank 0 and shares it).

With --listen HOST:0 a free port is chosen; the address is printed on stdout as
`listening on http://HOST:PORT`. The server runs until it is stopped (SIGINT or SIGTERM).")]
pub struct Args {
    /// Datasets whose tiers are served (a snapshot's dataset id names its tier).
    #[arg(required = true, value_name = "DATASET")]
    pub datasets: Vec<PathBuf>,
    /// The tier directory, as given to `granary read --cache-dir` on this node.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: PathBuf,
    /// Address to listen on, HOST:PORT (port 0: a free one, printed on stdout).
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// Threads answering requests.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// File holding the job's secret (default: the GRANARY_PEER_SECRET variable). Requests
    /// without a proof made with it are refused.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Answer every request that reaches the port, without a secret (a network where only the
    /// job's nodes can connect). Without a secret, serve refuses to start unless this is given.
    #[arg(long, conflicts_with = "secret_file")]
    pub insecure: bool,
    /// Serve over TLS with this certificate chain (PEM; its first certificate names this
    /// node's address), so that the bytes cannot be read in transit. Readers then need
    /// --peer-ca with the certificate that signed it.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let secret = if a.insecure {
        None
    } else {
        Some(super::job_secret(a.secret_file.as_deref())?.ok_or_else(|| {
            anyhow::anyhow!(
                "no secret: give the job's secret with --secret-file FILE or GRANARY_PEER_SECRET \
                 (readers take the same), or --insecure to answer anyone who reaches the port"
            )
        })?)
    };
    let mut tiers = HashMap::new();
    for d in &a.datasets {
        let ds = super::open_dataset(d)?;
        let id = ds.snapshot().dataset_id();
        let dir = granary::LocalTier::tier_dir(&a.cache_dir, &id);
        tiers.insert(granary::DatasetId(id).to_string(), dir);
    }
    let served = tiers.len();
    let server = PeerServer::bind(
        &a.listen,
        ServeConfig {
            tiers,
            secret,
            tls: a.tls_cert.zip(a.tls_key),
            threads: a.threads,
        },
    )
    .with_context(|| format!("cannot serve on {}", a.listen))?;
    eprintln!(
        "granary serve: the tiers of {served} dataset(s) under {}, read-only, at {}{}",
        a.cache_dir.display(),
        server.url(),
        if server.checks_proofs() {
            " (requests must be signed with the job's secret)"
        } else {
            " (--insecure: answering anyone who reaches the port)"
        }
    );
    println!("listening on {}", server.url());
    use std::io::Write;
    std::io::stdout().flush()?;
    server.serve()?;
    Ok(ExitCode::SUCCESS)
}
