//! How `redlock acquire` and `redlock run` take their lock.
//!
//! `acquire` makes one attempt on the warmed-up one-shot [`Redlock`], and,
//! when the lock is held and the command may wait, waits through a
//! [`SharedRedlock`] made from the same settings. The wait goes through
//! the shared client because only it subscribes to the resource's release
//! channel (`Config::wake_on_release`): it tries again as soon as the
//! holder releases, instead of at the next retry or at the holder's
//! expiry. The first attempt stays on the one-shot client, which connected
//! the masters before it (a quorum of servers and whoever else answers in
//! a brief grace, so that its round's timeout is spent on the lock, and
//! one server named twice is refused before it can vote), so that an
//! uncontended lock costs what it always did and `-n` never starts a
//! second client.
//!
//! `run` makes every attempt on the shared client that then keeps the lock
//! alive, so that the client extending the lock is the one that saw it
//! granted. This module decides nothing about exit codes beyond mapping
//! the library's errors through [`exit`].

use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

use redlock_mio::{Config, Error, Lock, Redlock, Retry, SharedRedlock};

use crate::exit::{self, Failure};
use crate::{AcquireOptions, say};

/// How long one call of the library keeps retrying when `run` or `acquire`
/// waits forever; between calls the wait is reported once, so that an
/// unreachable quorum does not look like a silent hang.
const FOREVER_SLICE: Duration = Duration::from_secs(10);

/// The client a lock was acquired through: the caller releases it there,
/// or keeps it alive through it.
pub enum Holder {
    /// The first attempt won (or `-n` allowed no other): the one-shot
    /// client.
    Single(Box<Redlock>),
    /// The lock was waited for: the shared client that waited.
    Shared(ManuallyDrop<SharedRedlock>),
}

/// A shared client for one command of `redlock`, which is never dropped.
/// Dropping a shared client's last handle waits, up to a per-instance
/// timeout, for the replies of the slowest masters (a stalled master's
/// never come); `redlock` exits once its last operation has its outcome,
/// as with its one-shot client, and the process's exit closes the
/// connections.
///
/// # Errors
/// As [`SharedRedlock::new`].
pub fn shared_client(config: Config) -> Result<ManuallyDrop<SharedRedlock>, Error> {
    SharedRedlock::new(config).map(ManuallyDrop::new)
}

impl Holder {
    /// Releases `lock` through the client that took it.
    ///
    /// # Errors
    /// As [`Redlock::release`].
    pub fn release(&mut self, lock: &Lock) -> Result<(), Error> {
        match self {
            Holder::Single(redlock) => redlock.release(lock),
            Holder::Shared(shared) => shared.release(lock),
        }
    }
}

/// One attempt on `redlock`, fenced or not as `options` say.
fn attempt_single(
    redlock: &mut Redlock,
    resource: &str,
    options: &AcquireOptions,
) -> Result<Lock, Error> {
    let once = Retry::once();
    if options.fence {
        redlock.acquire_fenced_with(resource.to_owned(), options.ttl, &once)
    } else {
        redlock.acquire_with(resource.to_owned(), options.ttl, &once)
    }
}

/// Attempts on `shared` as `retry` says, fenced or not as `options` say.
fn attempt_shared(
    shared: &SharedRedlock,
    resource: &str,
    options: &AcquireOptions,
    retry: &Retry,
) -> Result<Lock, Error> {
    if options.fence {
        shared.acquire_fenced_with(resource.to_owned(), options.ttl, retry)
    } else {
        shared.acquire_with(resource.to_owned(), options.ttl, retry)
    }
}

/// True for a failed first attempt that waiting may turn into a lock: the
/// lock is held, or too few masters answered. A setting the masters or
/// the OS refuse stays refused however long one waits.
fn worth_waiting(error: &Error) -> bool {
    !matches!(error, Error::Config(_) | Error::Os(_))
}

/// Acquires as `options` say: once, until `--wait` ends, or forever; the
/// first attempt on `redlock`, the wait on a shared client. Returns the
/// lock and the client that took it.
///
/// # Errors
/// The failure of the last attempt, with its exit code.
pub fn acquire_lock(
    mut redlock: Redlock,
    resource: &str,
    options: &AcquireOptions,
) -> Result<(Lock, Holder), Failure> {
    let context = format!("cannot acquire {resource:?}");
    let started = Instant::now();
    let first = match attempt_single(&mut redlock, resource, options) {
        Ok(lock) => return Ok((lock, Holder::Single(Box::new(redlock)))),
        Err(e) => e,
    };
    let left = wait_left(first, options, started, &context)?;
    // The failed attempt's cleanup (a release to every master) is on its
    // way; read its replies before the one-shot client goes, and start the
    // waiting client from the same settings.
    let round = redlock.config().per_instance_timeout;
    redlock.settle(round);
    let config = redlock.config().clone();
    drop(redlock);
    let shared = shared_client(config)
        .map_err(|e| exit::lock_error("cannot start the client", &e, options.conflict_exit_code))?;
    let lock = wait_shared(&shared, resource, options, left, &context)?;
    Ok((lock, Holder::Shared(shared)))
}

/// Acquires as `options` say, every attempt on `shared`: the first one
/// runs on this thread (a lone blocking call on a shared client does), and
/// a wait goes on from there. For `run`, whose lock `shared` then keeps
/// alive: the client that extends it saw the grant and read each master's
/// `run_id` at the time, which restart quarantine needs (a master that
/// restarted while it held the lock stays out of the quorum).
///
/// # Errors
/// The failure of the last attempt, with its exit code.
pub fn acquire_shared(
    shared: &SharedRedlock,
    resource: &str,
    options: &AcquireOptions,
) -> Result<Lock, Failure> {
    let context = format!("cannot acquire {resource:?}");
    let started = Instant::now();
    let first = match attempt_shared(shared, resource, options, &Retry::once()) {
        Ok(lock) => return Ok(lock),
        Err(e) => e,
    };
    let left = wait_left(first, options, started, &context)?;
    wait_shared(shared, resource, options, left, &context)
}

/// After a failed first attempt, begun at `started`: how long to go on
/// waiting (`None`: forever), or the failure to end with when `-n` was
/// given, the error is one that waiting cannot mend, or `--wait` is over.
fn wait_left(
    first: Error,
    options: &AcquireOptions,
    started: Instant,
    context: &str,
) -> Result<Option<Duration>, Failure> {
    let conflict = options.conflict_exit_code;
    if options.nonblock || !worth_waiting(&first) {
        return Err(exit::lock_error(context, &first, conflict));
    }
    // With --wait, what is left of it; nothing left ends where one call
    // with that --wait would have: after its first attempt.
    match options.wait {
        Some(wait) => match wait.checked_sub(started.elapsed()) {
            Some(left) if !left.is_zero() => Ok(Some(left)),
            _ => Err(exit::lock_error(context, &first, conflict)),
        },
        None => Ok(None),
    }
}

/// Waits on `shared` for the lock, `left` long or forever. Waiting forever
/// goes through the library in slices so that a quorum that stays
/// unreachable is reported on stderr instead of hanging silently;
/// contention is waited out without a word, as flock does.
fn wait_shared(
    shared: &SharedRedlock,
    resource: &str,
    options: &AcquireOptions,
    left: Option<Duration>,
    context: &str,
) -> Result<Lock, Failure> {
    let conflict = options.conflict_exit_code;
    match left {
        Some(left) => attempt_shared(shared, resource, options, &Retry::until(left))
            .map_err(|e| exit::lock_error(context, &e, conflict)),
        None => loop {
            match attempt_shared(shared, resource, options, &Retry::until(FOREVER_SLICE)) {
                Ok(lock) => return Ok(lock),
                Err(e) if exit::is_unreachable(&e) => {
                    say(&format!("{context} yet, still trying: {e}"));
                }
                Err(e) if exit::is_conflict(&e) => {}
                Err(e) => return Err(exit::lock_error(context, &e, conflict)),
            }
        },
    }
}
