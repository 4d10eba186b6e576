//! `redlock bench --rate`: an open-loop benchmark, in which operations
//! start at a rate fixed in advance whatever the replies do.
//!
//! A closed loop (each caller sends its next operation when the last one
//! replied) slows down with the system it measures, so a stall hides the
//! operations that would have queued behind it: coordinated omission. Here
//! the schedule ([`schedule`]) says when each operation is meant to start,
//! and the record ([`record`]) times each one from that intended start as
//! well as from its actual send, as wrk2 does. Both are plain data in and
//! out, with no clock and no socket, so that their arithmetic is tested
//! apart from the network; the driver that sleeps, sends and reads the
//! clock is the only part that does.

// The driver that uses them lands next; until then only the tests do.
#![cfg_attr(not(test), allow(dead_code))]

pub(crate) mod record;
pub(crate) mod schedule;
