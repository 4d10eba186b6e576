//! The test harness itself against real redis-server processes: masters
//! start, answer, crash, restart, stall and go away when dropped.

mod common;

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;
use std::time::Duration;

use common::{
    IO_TIMEOUT, Options, Server, bulk, cluster, connect, eventually, master, master_with, status,
    try_connect,
};
use redlock_mio::resp::{Arg, Reply};
use redlock_test::{Cluster, SpawnError};

fn process_is_gone(pid: u32) -> bool {
    eventually(Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    })
}

fn ping(server: &Server) -> Reply {
    connect(server).cmd(&["PING".into()])
}

#[test]
fn a_cluster_of_three_masters_each_answers_ping_on_its_own_port() {
    let masters = cluster(3);
    assert_eq!(masters.len(), 3);
    for server in &masters {
        assert_eq!(ping(server), status("PONG"), "{}", server.url());
        assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    }
    let mut ports: Vec<u16> = masters.iter().map(Server::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "three distinct ports");
    assert_eq!(masters.urls().len(), 3);
}

#[test]
fn masters_of_a_cluster_are_independent() {
    let mut masters = cluster(3);
    connect(&masters[0]).cmd(&["SET".into(), "k".into(), "v".into()]);
    assert_eq!(
        connect(&masters[1]).cmd(&["GET".into(), "k".into()]),
        Reply::Nil,
        "no replication between masters"
    );
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ping(&masters[0]), status("PONG"));
    assert_eq!(ping(&masters[1]), status("PONG"));
}

#[test]
fn a_killed_master_restarts_empty_on_the_same_port() {
    let mut server = master();
    let port = server.port();
    let first_pid = server.pid();
    connect(&server).cmd(&["SET".into(), "k".into(), "v".into()]);

    server.kill().unwrap_or_else(|e| panic!("{e}"));
    assert!(!server.is_running());
    assert!(process_is_gone(first_pid));
    assert!(
        try_connect(&server).is_err(),
        "nothing listens after a kill"
    );

    server.restart().unwrap_or_else(|e| panic!("{e}"));
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), first_pid);
    let mut c = connect(&server);
    assert_eq!(c.cmd(&["PING".into()]), status("PONG"));
    assert_eq!(
        c.cmd(&["GET".into(), "k".into()]),
        Reply::Nil,
        "a restarted master has lost its keys"
    );
}

#[test]
fn a_running_or_paused_master_can_be_restarted() {
    let mut server = master();
    server.restart().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ping(&server), status("PONG"));
    server.pause().unwrap_or_else(|e| panic!("{e}"));
    server.restart().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ping(&server), status("PONG"));
}

#[test]
fn a_paused_master_stalls_reads_until_resumed() {
    let mut server = master();
    let mut c = connect(&server);
    assert_eq!(c.cmd(&["PING".into()]), status("PONG"));

    server.pause().unwrap_or_else(|e| panic!("{e}"));
    assert!(server.is_running(), "a paused process is still running");
    c.set_read_timeout(Some(Duration::from_millis(200)));
    match c.try_cmd(&["PING".into()]) {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) => {}
        other => panic!("expected a read timeout from a paused master, got {other:?}"),
    }

    server.resume().unwrap_or_else(|e| panic!("{e}"));
    c.set_read_timeout(Some(IO_TIMEOUT));
    assert_eq!(
        c.read_reply().unwrap_or_else(|e| panic!("{e}")),
        status("PONG"),
        "the stalled command is answered after resume"
    );
    assert_eq!(c.cmd(&["PING".into()]), status("PONG"));
}

#[test]
fn dropping_a_server_ends_its_process_and_removes_its_directory() {
    let server = master();
    let pid = server.pid();
    let dir = server.dir().to_path_buf();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    assert!(dir.join("redis.log").exists());
    drop(server);
    assert!(process_is_gone(pid), "pid {pid} still exists after drop");
    assert!(!dir.exists(), "{} still exists after drop", dir.display());
}

#[test]
fn dropping_a_paused_server_still_ends_its_process() {
    let mut server = master();
    let pid = server.pid();
    server.pause().unwrap_or_else(|e| panic!("{e}"));
    drop(server);
    assert!(process_is_gone(pid), "pid {pid} still exists after drop");
}

#[test]
fn dropping_a_cluster_ends_every_process() {
    let masters = cluster(3);
    let pids: Vec<u32> = masters.iter().map(Server::pid).collect();
    drop(masters);
    for pid in pids {
        assert!(process_is_gone(pid), "pid {pid} still exists after drop");
    }
}

#[test]
fn a_missing_binary_is_one_clear_error_line() {
    let opts = Options::new().binary("/nonexistent/redis-server");
    let err = Server::start(&opts).expect_err("no binary at /nonexistent");
    assert!(matches!(err, SpawnError::NotFound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("redis-server not found"), "{text}");
    assert!(text.contains("apt-get install -y redis-server"), "{text}");
    assert!(!text.contains('\n'), "one line: {text}");

    let err = Cluster::start(3, &opts).expect_err("no binary at /nonexistent");
    assert!(matches!(err, SpawnError::NotFound { .. }), "{err:?}");
}

#[test]
fn a_bad_argument_fails_with_the_server_output() {
    let opts = Options::new().args(["--no-such-option", "1"]);
    let err = Server::start(&opts).expect_err("redis-server rejects unknown options");
    assert!(matches!(err, SpawnError::Exited { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-option"), "{err}");
}

#[test]
fn a_password_protected_master_starts_and_requires_auth() {
    let server = master_with(&Options::new().requirepass("pw"));
    assert_eq!(server.password(), Some("pw"));
    let mut c = connect(&server);
    assert!(c.cmd(&["PING".into()]).is_error_code(b"NOAUTH"));
    assert!(c.cmd(&["AUTH".into(), "pw".into()]).is_ok());
    assert_eq!(c.cmd(&["PING".into()]), status("PONG"));
}

#[test]
fn extra_arguments_reach_the_server() {
    let acl: [&str; 7] = ["--user", "alice", "on", ">pw", "~*", "&*", "+@all"];
    let opts = Options::new()
        .args(acl)
        .args(["--maxmemory-policy", "allkeys-lru"]);
    let server = master_with(&opts);
    let mut c = connect(&server);
    assert!(c.cmd(&["AUTH".into(), "alice".into(), "pw".into()]).is_ok());
    assert_eq!(
        c.cmd(&["CONFIG".into(), "GET".into(), "maxmemory-policy".into()]),
        Reply::Array(vec![bulk("maxmemory-policy"), bulk("allkeys-lru")])
    );
}

#[test]
fn a_unix_socket_answers_ping_too() {
    let server = master_with(&Options::new().unix_socket(true));
    let path = server.unix_socket().expect("a socket was asked for");
    let mut stream = UnixStream::connect(path).unwrap_or_else(|e| panic!("{e}"));
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut out = bytes::BytesMut::new();
    redlock_mio::resp::encode_command(&mut out, &[Arg::from("PING")]);
    stream.write_all(&out).unwrap_or_else(|e| panic!("{e}"));
    let mut reply = [0u8; 7];
    stream
        .read_exact(&mut reply)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&reply, b"+PONG\r\n");
    assert_eq!(ping(&server), status("PONG"), "TCP still listens");
}

#[test]
fn a_master_that_never_answers_times_out_and_is_killed() {
    // Listening on the unix socket only, it never answers on its TCP port.
    let opts = Options::new()
        .unix_socket(true)
        .args(["--port", "0"])
        // Long enough for a loaded machine's redis-server to have logged
        // its start (the pid checked below).
        .startup_timeout(Duration::from_secs(3));
    let err = Server::start(&opts).expect_err("nothing answers on the TCP port");
    let SpawnError::Timeout { log_tail, .. } = &err else {
        panic!("expected a timeout, got {err:?}");
    };
    assert!(err.to_string().contains("did not answer PING"), "{err}");
    // Every line of a redis log starts with "<pid>:<role>".
    let pid: u32 = log_tail
        .lines()
        .find_map(|line| line.split(':').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no pid in the log tail:\n{log_tail}"));
    assert!(
        process_is_gone(pid),
        "pid {pid} still exists after a timeout"
    );
}

#[test]
fn a_restart_waits_out_a_port_that_is_briefly_taken() {
    let mut server = master();
    server.kill().unwrap_or_else(|e| panic!("{e}"));
    let squatter = std::net::TcpListener::bind(server.addr())
        .unwrap_or_else(|e| panic!("taking {} for a moment: {e}", server.addr()));
    // The port is released while restart is already retrying; how long it
    // is held only has to stay well below restart's few seconds of retries.
    let releaser = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        drop(squatter);
    });
    let restarted = server.restart();
    releaser
        .join()
        .unwrap_or_else(|_| panic!("the releasing thread panicked"));
    restarted.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ping(&server), status("PONG"));
}
