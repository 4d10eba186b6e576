//! `redlock`: the command line of redlock-mio.
//!
//! This binary owns argument parsing, exit codes and everything an operator
//! sees; the lock semantics stay in the library. `run` holds a lock while a
//! command runs (as `flock(1)` and `etcdctl lock` do), `acquire`, `release`
//! and `extend` act on a lock from a shell script, `bench` measures
//! acquire/release latency, and `probe` checks a deployment. Every failure
//! ends as one `redlock: ...` line on stderr and an exit code from
//! [`exit`]; nothing here panics on bad input or a broken pipe.

mod acquire;
mod bench;
mod caller;
mod cert;
mod exit;
mod group;
mod openloop;
mod probe;
mod run;
mod signals;
mod tasks;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redlock_mio::{Config, Lock, LockCommands, Redlock, TlsConfig, Token};

use crate::acquire::acquire_lock;
use crate::exit::Failure;

/// The environment variable read when no `--servers` is given.
pub const SERVERS_ENV: &str = "REDLOCK_SERVERS";

/// Bounds of the default per-master timeout of the lock commands.
const ROUND_TIMEOUT_MIN: Duration = Duration::from_millis(50);
const ROUND_TIMEOUT_MAX: Duration = Duration::from_millis(500);

/// Default connect and read timeout of `probe`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Parser, Debug)]
#[command(
    name = "redlock",
    version,
    about = "Redlock distributed locks over N independent Redis masters",
    long_about = "Redlock distributed locks over N independent Redis masters.\n\n\
        A lock is held when a majority of the masters accept it within its \
        validity. Masters come from --servers (comma-separated or repeated) \
        or else from the REDLOCK_SERVERS environment variable, as \
        redis://[user:password@]host[:port][/db] or unix:///path[?db=N] URLs.\n\n\
        Durations are written 30s, 500ms, 1m30s (a bare number is seconds).",
    after_help = exit::TABLE,
    propagate_version = true
)]
struct Cli {
    /// Redis masters (comma-separated or repeated); default: $REDLOCK_SERVERS
    #[arg(
        short = 's',
        long = "servers",
        value_name = "URL,...",
        value_delimiter = ',',
        global = true
    )]
    servers: Vec<String>,

    /// How long a master may take to answer (connecting included, on first
    /// use) [default: TTL/20 within 50ms..500ms; bench: 50ms; probe: 2s]
    #[arg(long, value_name = "D", global = true, value_parser = parse_duration)]
    timeout: Option<Duration>,

    /// How long connecting a master may take, and how long a connection
    /// may leave a request unanswered before it is dropped (lock commands
    /// and bench; probe's connects take --timeout) [default: the
    /// library's, 1s]
    #[arg(long, value_name = "D", global = true, value_parser = parse_duration)]
    connect_timeout: Option<Duration>,

    /// Restart quarantine's maximum TTL: a master up for less than this
    /// does not count toward the quorum, and longer TTLs are refused
    /// [default: the library's, 60s]
    #[arg(long, value_name = "D", global = true, value_parser = parse_duration)]
    max_ttl: Option<Duration>,

    /// Turn restart quarantine off: for masters that persist every write
    /// (appendfsync always) or were started empty for this use
    #[arg(long, global = true, conflicts_with = "max_ttl")]
    no_quarantine: bool,

    /// PEM file of the certificate authorities that rediss:// masters'
    /// certificates must chain to [default: the system's roots]
    #[arg(long, value_name = "FILE", global = true, env = "REDLOCK_TLS_CA")]
    tls_ca: Option<PathBuf>,

    /// PEM file of a client certificate for rediss:// masters that ask for
    /// one (mutual TLS; with --tls-key)
    #[arg(
        long,
        value_name = "FILE",
        global = true,
        env = "REDLOCK_TLS_CERT",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,

    /// PEM file of the client certificate's private key (with --tls-cert)
    #[arg(
        long,
        value_name = "FILE",
        global = true,
        env = "REDLOCK_TLS_KEY",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,

    /// Which commands release and extend locks: `auto`, each master's own
    /// (DELIFEQ, DELEX, SET IFEQ) where it has them and Lua scripts
    /// elsewhere; `scripts`, the scripts everywhere, for a proxy that
    /// refuses commands it does not know
    #[arg(long, value_name = "WHICH", global = true, default_value = "auto", value_parser = parse_lock_commands)]
    lock_commands: LockCommands,

    #[command(subcommand)]
    command: Command,
}

fn parse_lock_commands(text: &str) -> Result<LockCommands, String> {
    match text {
        "auto" => Ok(LockCommands::Auto),
        "scripts" => Ok(LockCommands::Scripts),
        other => Err(format!("{other:?}: give auto or scripts")),
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock, and exit with its status
    #[command(
        long_about = "Acquire RESOURCE, run CMD while keeping the lock alive, release it \
            when CMD exits, and exit with CMD's status.\n\n\
            The lock is extended (to the same TTL) every third of the TTL. When \
            extending keeps failing until about a third of the TTL of validity is left \
            (or a quorum says the token no longer holds the key), the lock is lost: CMD \
            gets SIGTERM, then SIGKILL after --kill-after or just before the lock's \
            deadline, whichever comes first, and redlock exits 75. CMD never outlives the \
            lock: redlock also watches the deadline on its own clock, and exits 75 when \
            CMD finishes after it, whatever CMD's status. CMD runs in a process group of \
            its own, and these signals go to the whole group, so that what CMD started \
            is stopped too (after CMD has exited, until the group is gone or killed). \
            SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to redlock, a terminal's Ctrl-C \
            included, are forwarded to the group; a Ctrl-Z stops the group, then \
            redlock, and fg or bg continues both. A CMD in its own group is stopped by \
            SIGTTIN if it reads the terminal: give such a CMD --foreground, which keeps \
            it in redlock's group (it then gets the terminal's signals itself, but only \
            CMD, not what it started, is signalled at a loss). CMD sees REDLOCK_RESOURCE \
            and REDLOCK_TOKEN (and REDLOCK_FENCE with --fence) in its environment, and is \
            sent SIGTERM if redlock itself dies (Linux), since nobody then keeps its lock \
            alive.",
        after_help = exit::TABLE
    )]
    Run(run::RunArgs),

    /// Acquire a lock; print its token (and fence) on stdout, its validity on stderr
    #[command(
        long_about = "Acquire RESOURCE and print the lock's token as the only line on \
            stdout, so that `token=$(redlock acquire RESOURCE)` works; with --fence the \
            line is `TOKEN FENCE` (`read -r token fence`). The validity (milliseconds of \
            mutual exclusion left) goes to stderr as `redlock: validity N ms`. Release \
            with `redlock release RESOURCE TOKEN`, or let the lock expire after its TTL.",
        after_help = exit::TABLE
    )]
    Acquire(AcquireArgs),

    /// Release a lock by its token
    #[command(after_help = exit::TABLE)]
    Release(TokenArgs),

    /// Extend a lock by its token to a new TTL from now
    #[command(after_help = exit::TABLE)]
    Extend(ExtendArgs),

    /// Measure acquire and release latency and throughput
    #[command(long_about = bench::LONG_ABOUT)]
    Bench(bench::BenchArgs),

    /// Check each master: reachability, version, round trip, safety settings
    #[command(long_about = probe::LONG_ABOUT)]
    Probe,
}

/// How to acquire: TTL, how long to wait, and the code for "not in time".
#[derive(Args, Debug, Clone)]
pub struct AcquireOptions {
    /// Lifetime of the lock's keys (extended by `run` while CMD runs)
    #[arg(long, value_name = "D", default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,

    /// Give up acquiring after D [default: wait until acquired]
    #[arg(short = 'w', long, value_name = "D", value_parser = parse_duration)]
    pub wait: Option<Duration>,

    /// Try once: fail at once when the lock is held
    #[arg(short = 'n', long, conflicts_with = "wait")]
    pub nonblock: bool,

    /// Exit code when the lock could not be had in time
    #[arg(
        short = 'E',
        long = "conflict-exit-code",
        value_name = "CODE",
        default_value_t = exit::CONFLICT
    )]
    pub conflict_exit_code: u8,

    /// Take a fencing token too: a number larger than that of every
    /// earlier fenced lock on RESOURCE (one more round trip)
    #[arg(long)]
    pub fence: bool,
}

#[derive(Args, Debug)]
struct AcquireArgs {
    /// The lock's name (the Redis key)
    resource: String,

    #[command(flatten)]
    acquire: AcquireOptions,
}

#[derive(Args, Debug)]
struct TokenArgs {
    /// The lock's name (the Redis key)
    resource: String,
    /// The token printed by `redlock acquire`
    token: String,
}

#[derive(Args, Debug)]
struct ExtendArgs {
    #[command(flatten)]
    lock: TokenArgs,

    /// The new TTL, counted from now
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    ttl: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = dispatch(&cli);
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            say(&failure.message);
            ExitCode::from(failure.code)
        }
    }
}

fn dispatch(cli: &Cli) -> Result<u8, Failure> {
    if cli.timeout.is_some_and(|t| t.is_zero()) {
        return Err(Failure::usage("--timeout must be more than zero"));
    }
    if cli.connect_timeout.is_some_and(|t| t.is_zero()) {
        return Err(Failure::usage("--connect-timeout must be more than zero"));
    }
    if cli.max_ttl.is_some_and(|t| t.is_zero()) {
        return Err(Failure::usage("--max-ttl must be more than zero"));
    }
    let quarantine = Quarantine {
        max_ttl: cli.max_ttl,
        off: cli.no_quarantine,
    };
    let mut tls = TlsConfig::default();
    tls.ca_file = cli.tls_ca.clone();
    tls.cert_file = cli.tls_cert.clone();
    tls.key_file = cli.tls_key.clone();
    let client = |ttl: Option<Duration>| {
        let timeout = round_timeout(cli.timeout, ttl);
        client(
            &cli.servers,
            timeout,
            cli.connect_timeout,
            quarantine,
            &tls,
            cli.lock_commands,
        )
    };
    match &cli.command {
        Command::Run(args) => {
            // Warmed up for what it learns (one server named twice), then
            // dropped: `run` locks through the shared client that keeps
            // the lock alive.
            let mut redlock = client(Some(args.acquire.ttl))?;
            warm_up(&mut redlock)?;
            run::run(redlock.config().clone(), args)
        }
        Command::Acquire(args) => acquire(client(Some(args.acquire.ttl))?, args),
        Command::Release(args) => release(client(None)?, args),
        Command::Extend(args) => extend(client(Some(args.ttl))?, args),
        Command::Bench(args) => bench::bench(
            &cli.servers,
            cli.timeout,
            cli.connect_timeout,
            quarantine,
            &tls,
            cli.lock_commands,
            args,
        ),
        Command::Probe => probe::probe(
            &server_urls(&cli.servers)?,
            cli.timeout.unwrap_or(PROBE_TIMEOUT),
            quarantine,
            &tls,
        ),
    }
}

/// Prints `redlock: message` on stderr. A closed or broken stderr is no
/// reason to panic: the exit code still tells.
pub fn say(message: &str) {
    let _ = writeln!(io::stderr().lock(), "redlock: {message}");
}

/// The master URLs: `--servers`, else `REDLOCK_SERVERS`.
///
/// # Errors
/// A usage failure when neither names a master.
pub fn server_urls(flag: &[String]) -> Result<Vec<String>, Failure> {
    let given: Vec<String> = flag
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if !given.is_empty() {
        return Ok(given);
    }
    let from_env = match std::env::var(SERVERS_ENV) {
        Ok(value) => split_servers(&value),
        Err(std::env::VarError::NotPresent) => Vec::new(),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(Failure::usage(format!("{SERVERS_ENV} is not valid UTF-8")));
        }
    };
    if from_env.is_empty() {
        return Err(Failure::usage(format!(
            "no Redis masters given: use --servers URL,URL,... or set {SERVERS_ENV}"
        )));
    }
    Ok(from_env)
}

/// Splits a server list on commas and whitespace.
fn split_servers(value: &str) -> Vec<String> {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The settings for these masters, with the TLS flags (`--tls-ca`,
/// `--tls-cert`, `--tls-key`, or their environment variables); a malformed
/// URL is a usage error.
pub fn config(
    urls: &[String],
    tls: &TlsConfig,
    lock_commands: LockCommands,
) -> Result<Config, Failure> {
    let mut config = Config::new(urls).map_err(|e| Failure::usage(e.to_string()))?;
    config.tls = tls.clone();
    config.lock_commands = lock_commands;
    Ok(config)
}

/// The per-master timeout of a lock command: `--timeout`, else a twentieth
/// of the TTL within 50 to 500 ms. Small next to the TTL, as the spec asks
/// (what a round takes comes off the validity), yet enough for a one-shot
/// command's first round, which also connects, on a busy machine: the
/// library's 50 ms suits a warm, long-lived client.
fn round_timeout(flag: Option<Duration>, ttl: Option<Duration>) -> Duration {
    flag.unwrap_or_else(|| {
        ttl.map_or(ROUND_TIMEOUT_MAX, |ttl| {
            (ttl / 20).clamp(ROUND_TIMEOUT_MIN, ROUND_TIMEOUT_MAX)
        })
    })
}

/// The restart quarantine flags.
#[derive(Debug, Clone, Copy)]
pub struct Quarantine {
    /// `--max-ttl`.
    pub max_ttl: Option<Duration>,
    /// `--no-quarantine`.
    pub off: bool,
}

impl Quarantine {
    /// Applies the flags to `config`, whose default stays otherwise.
    pub fn apply(self, config: &mut Config) {
        if self.off {
            config.quarantine = None;
        } else if let Some(max) = self.max_ttl {
            config.quarantine = Some(max);
        }
    }
}

/// A client for the masters given on the command line or in the
/// environment, waiting `timeout` for each master's answer, and
/// `connect_timeout` (`--connect-timeout`), when given, for each connect.
fn client(
    flag: &[String],
    timeout: Duration,
    connect_timeout: Option<Duration>,
    quarantine: Quarantine,
    tls: &TlsConfig,
    lock_commands: LockCommands,
) -> Result<Redlock, Failure> {
    let mut config = config(&server_urls(flag)?, tls, lock_commands)?;
    config.per_instance_timeout = timeout;
    if let Some(connect_timeout) = connect_timeout {
        config.connect_timeout = connect_timeout;
    }
    quarantine.apply(&mut config);
    Redlock::new(config)
        .map_err(|e| exit::lock_error("cannot start the client", &e, exit::CONFLICT))
}

/// Connects the masters before the first round of a command that takes
/// or extends a lock, so that one server named twice is known, and
/// refused (exit 2), before it can vote, the round's timeout goes to the
/// lock rather than to connecting, and the round's requests are written
/// to every master that answers before `redlock` exits. Only until a quorum of servers is
/// ready and the others have had a brief grace
/// ([`Redlock::warm_up_quorum`]): a stalled master (connects that
/// succeed, a handshake never answered) must not hold every command for
/// the connect timeout. The first round carries the slower masters'
/// handshakes, and counts one vote per server in any case.
///
/// # Errors
/// A usage failure when two masters are one server.
fn warm_up(redlock: &mut Redlock) -> Result<(), Failure> {
    let timeout = redlock.config().connect_timeout;
    redlock
        .warm_up_quorum(timeout)
        .map(drop)
        .map_err(|e| exit::lock_error("cannot use these masters", &e, exit::CONFLICT))
}

/// Parses a duration: humantime's `30s`, `500ms`, `1m30s`, or a bare
/// number of seconds as `flock -w` takes it.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{text:?} is not a duration of zero or more seconds"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations as 30s, 500ms, 1m30s or plain seconds)"))
}

fn acquire(mut redlock: Redlock, args: &AcquireArgs) -> Result<u8, Failure> {
    warm_up(&mut redlock)?;
    let (lock, mut holder) = acquire_lock(redlock, &args.resource, &args.acquire)?;
    let printed = match lock.fence() {
        Some(fence) => writeln!(io::stdout().lock(), "{} {fence}", lock.token()),
        None => writeln!(io::stdout().lock(), "{}", lock.token()),
    };
    if let Err(e) = printed {
        // Nobody learnt the token, so nobody could release the lock: do it.
        let _ = holder.release(&lock);
        return Err(Failure::new(
            exit::OSERR,
            format!("cannot print the token ({e}); the lock has been released"),
        ));
    }
    say(&format!("validity {} ms", lock.remaining().as_millis()));
    Ok(exit::OK)
}

fn parts(args: &TokenArgs) -> Result<Lock, Failure> {
    let text = args.token.trim();
    let token = Token::parse(text).map_err(|e| Failure::usage(format!("malformed token: {e}")))?;
    // Only `acquire`'s tokens can be held: one cut short or mistyped is a
    // usage error, not a lock "no longer held".
    if !is_printed_token(text) {
        return Err(Failure::usage(format!(
            "malformed token {text:?}: `redlock acquire` prints {PRINTED_TOKEN_LEN} lowercase \
             hex digits"
        )));
    }
    Ok(Lock::from_parts(args.resource.clone(), token))
}

/// How long a token `redlock acquire` prints is.
const PRINTED_TOKEN_LEN: usize = 48;

/// Whether `text` has the shape of a token `redlock acquire` prints.
fn is_printed_token(text: &str) -> bool {
    text.len() == PRINTED_TOKEN_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn release(mut redlock: Redlock, args: &TokenArgs) -> Result<u8, Failure> {
    let lock = parts(args)?;
    // Warmed up too, so that the release is written to every master that
    // answers, not only to those connected when a quorum has answered
    // (redlock then exits, and a master whose connection, a TLS one say,
    // was still being made would keep the key until it expires). One
    // server named twice does not matter here: a release can only free
    // keys.
    let timeout = redlock.config().connect_timeout;
    let _ = redlock.warm_up_quorum(timeout);
    let context = format!("cannot release {:?}", args.resource);
    redlock
        .release(&lock)
        .map_err(|e| exit::lock_error(&context, &e, exit::CONFLICT))?;
    Ok(exit::OK)
}

fn extend(mut redlock: Redlock, args: &ExtendArgs) -> Result<u8, Failure> {
    let mut lock = parts(&args.lock)?;
    warm_up(&mut redlock)?;
    let context = format!("cannot extend {:?}", args.lock.resource);
    redlock
        .extend(&mut lock, args.ttl)
        .map_err(|e| exit::lock_error(&context, &e, exit::CONFLICT))?;
    say(&format!("validity {} ms", lock.remaining().as_millis()));
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_plain_seconds() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("30s", Some(Duration::from_secs(30))),
            ("500ms", Some(Duration::from_millis(500))),
            ("1m 30s", Some(Duration::from_secs(90))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("2", Some(Duration::from_secs(2))),
            ("0.25", Some(Duration::from_millis(250))),
            ("-1", None),
            ("inf", None),
            ("5 parsecs", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text).ok(), *want, "{text:?}");
        }
    }

    #[test]
    fn the_default_timeout_is_a_twentieth_of_the_ttl_within_bounds() {
        let ms = Duration::from_millis;
        let cases = [
            (None, Some(Duration::from_secs(30)), ms(500)),
            (None, Some(Duration::from_secs(2)), ms(100)),
            (None, Some(ms(100)), ms(50)),
            (None, None, ms(500)),
            (Some(ms(7)), Some(Duration::from_secs(30)), ms(7)),
        ];
        for (flag, ttl, want) in cases {
            assert_eq!(round_timeout(flag, ttl), want, "{flag:?} {ttl:?}");
        }
    }

    #[test]
    fn server_lists_split_on_commas_and_spaces() {
        assert_eq!(
            split_servers(" redis://a:1, redis://b:2 ,,unix:///s\tredis://c"),
            ["redis://a:1", "redis://b:2", "unix:///s", "redis://c"]
        );
        assert!(split_servers(" , ").is_empty());
    }

    #[test]
    fn only_tokens_shaped_as_acquire_prints_them_are_taken() {
        let printed = "0123456789abcdef0123456789abcdef0123456789abcdef";
        let cases = [
            ("as printed", printed.to_owned(), true),
            ("cut short", printed[..47].to_owned(), false),
            ("one too many", format!("{printed}0"), false),
            ("upper case", printed.to_uppercase(), false),
            ("not hex", printed.replacen('a', "g", 1), false),
            ("a word", "not-the-token".to_owned(), false),
        ];
        for (name, text, taken) in cases {
            assert_eq!(is_printed_token(&text), taken, "{name}");
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
