/* A measurement probe, not part of Astraeus: the per-worker supervisor (shim and the worker's PID 1) in C, for
 * bench_throughput.py's case only (an isolated worker with no drives, configs or stop request), to measure what a
 * supervisor that is not a Python process per worker would save (benchmarks/README.md, "Fifteenth round").
 * It keeps the Python shim's files (shim.json, started.json, log.jsonl, exit.json), cgroups, PID namespace and the
 * worker's view made from the launcher's prepared one, but none of its other guarantees: a stop (SIGTERM or SIGUSR1
 * to it) is SIGTERM to the command and, 2 s later, the cgroup killed, with no stop reason file, no grace from
 * stop.json and no kill of descendants outside the cgroup; no OOM message, no rewrite of a wiped folder, no log
 * rotation, no UTF-8 replacement of invalid bytes in the log; and it takes the
 * worker's environment on its command line, which every user of the machine can read in /proc (the real one must
 * not). Built and wired in by native_shim.sh. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef AT_EMPTY_PATH
#define AT_EMPTY_PATH 0x1000
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x4
#endif

static char *dir, *cwd, *sigdir, *command, *limits_json, *cgroups_json;
static char *args[256], *envs[1024], *hides[64], *exposes[64], *cgdirs[16];
static int nargs, nenvs, nhides, nexposes, ncg;
static int uid, gid, template_fd = 3;
static double create_time_self;
static char state_dir[4096];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double create_time(int pid) {
    char p[64], buf[4096];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *s = strrchr(buf, ')');
    if (!s) return 0;
    s += 2;
    int field = 3;
    while (*s && field < 22) {
        if (*s == ' ') field++;
        s++;
    }
    unsigned long long ticks = strtoull(s, NULL, 10);
    static double btime = -1;
    if (btime < 0) {
        FILE *f = fopen("/proc/stat", "re");
        char line[512];
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "btime ", 6)) btime = atof(line + 6);
        if (f) fclose(f);
    }
    return ticks / (double)sysconf(_SC_CLK_TCK) + btime;
}

static void notify(void) {
    char p[4200];
    snprintf(p, sizeof p, "%s/events.fifo", state_dir);
    int fd = open(p, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;
    if (write(fd, "!", 1) < 0) {}
    close(fd);
}

static void write_file(const char *name, const char *data, int notify_it, int durable) {
    char p[4200], tmp[4300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", p, getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    size_t len = strlen(data), off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w <= 0) break;
        off += w;
    }
    rename(tmp, p);
    if (notify_it) notify();
    if (durable) fsync(fd);
    close(fd);
}

/* JSON string escaping of `s` (n bytes, invalid UTF-8 passed through) into out */
static size_t jesc(char *out, const char *s, size_t n) {
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') { out[o++] = '\\'; out[o++] = c; }
        else if (c == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else if (c == '\t') { out[o++] = '\\'; out[o++] = 't'; }
        else if (c < 0x20) o += sprintf(out + o, "\\u%04x", c);
        else out[o++] = c;
    }
    out[o++] = '"';
    return o;
}

static int log_fd = -1, seq = 0;
static char partial[2][65536];
static size_t plen[2];

static void emit(int stream, const char *s, size_t n, double t) {
    if (n && s[n - 1] == '\r') n--;
    static char line[6 * 65536 + 256];
    size_t o = sprintf(line, "{\"seq\": %d, \"time\": %.6f, \"stream\": \"%s\", \"text\": ", ++seq, t,
                       stream ? "stderr" : "stdout");
    o += jesc(line + o, s, n);
    line[o++] = '}';
    line[o++] = '\n';
    if (write(log_fd, line, o) < 0) {}
}

static void feed(int stream, const char *buf, size_t n, double t) {
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            emit(stream, partial[stream], plen[stream], t);
            plen[stream] = 0;
        } else {
            partial[stream][plen[stream]++] = buf[i];
            if (plen[stream] == sizeof partial[0]) {
                emit(stream, partial[stream], plen[stream], t);
                plen[stream] = 0;
            }
        }
    }
}

static void die_failed(const char *msg) {
    char buf[8192];
    size_t o = sprintf(buf, "{\"message\": ");
    o += jesc(buf + o, msg, strlen(msg));
    sprintf(buf + o, ", \"time\": %.6f}", now());
    for (int i = 0; i < ncg; i++) rmdir(cgdirs[i]);
    write_file("failed.json", buf, 1, 1);
    exit(0);
}

static void tmpfs(const char *path, const char *mode) {
    char opts[64];
    snprintf(opts, sizeof opts, "mode=%s,uid=0,gid=0", mode);
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts)) {
        fprintf(stderr, "tmpfs %s: %s\n", path, strerror(errno));
        _exit(126);
    }
}

static dev_t ours[8];
static int nours;
static int is_ours(dev_t d) {
    for (int i = 0; i < nours; i++) if (ours[i] == d) return 1;
    return 0;
}
static void our_tmpfs(const char *path, const char *mode) {
    struct stat st;
    tmpfs(path, mode);
    if (!stat(path, &st)) ours[nours++] = st.st_dev;
}

static void mkdirs(const char *path) {
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') { *s = 0; mkdir(p, 0755); *s = '/'; }
    mkdir(p, 0755);
}

static int tree(const char *path) {
    int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int t = syscall(SYS_open_tree, fd, "", OPEN_TREE_CLONE | AT_EMPTY_PATH | O_CLOEXEC);
    close(fd);
    return t;
}

static void bind(int t, const char *path, int ro) {
    mkdirs(path);
    if (syscall(SYS_move_mount, t, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH)) {
        fprintf(stderr, "move_mount %s: %s\n", path, strerror(errno));
        _exit(126);
    }
    if (ro) mount(NULL, path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
}

static char *find_in_path(const char *name) {
    if (strchr(name, '/')) return strdup(name);
    const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for (int i = 0; i < nenvs; i++) if (!strncmp(envs[i], "PATH=", 5)) path = envs[i] + 5;
    char *copy = strdup(path), *save = NULL;
    for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", d, name);
        if (!access(p, X_OK)) return strdup(p);
    }
    return NULL;
}

/* the worker's PID 1 */
static void pid1(int go_r, int res_w, int status_w, int ack_r, int out_w, int err_w) {
    char c;
    if (read(go_r, &c, 1) != 1) _exit(0);
    close(go_r);
    int work = tree(cwd), sig = tree(sigdir);
    int expt[64];
    for (int i = 0; i < nexposes; i++) expt[i] = tree(exposes[i]);
    if (setns(template_fd, CLONE_NEWNS) || unshare(CLONE_NEWNS)) {
        dprintf(res_w, "FAIL:cannot enter the view: %s", strerror(errno));
        _exit(126);
    }
    close(template_fd);
    if (chdir("/")) {}
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    our_tmpfs("/tmp", "1777");
    our_tmpfs("/root", "755");
    struct stat st;
    if (!stat("/dev/shm", &st) && S_ISDIR(st.st_mode)) our_tmpfs("/dev/shm", "1777");
    for (int i = 0; i < nhides; i++)
        if (!stat(hides[i], &st) && S_ISDIR(st.st_mode) && !is_ours(st.st_dev)) our_tmpfs(hides[i], "755");
    for (int i = 0; i < nexposes; i++) if (expt[i] >= 0) bind(expt[i], exposes[i], 1);
    bind(work, cwd, 0);
    bind(sig, sigdir, 1);
    mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
    /* drop privileges */
    for (int cap = 0; cap < 64; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    if (setgroups(0, NULL) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid)) {
        dprintf(res_w, "FAIL:cannot drop privileges: %s", strerror(errno));
        _exit(126);
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (chdir(cwd)) {}
    char *path = find_in_path(command);
    if (!path) {
        dprintf(res_w, "%s: No such file or directory", command);
        _exit(127);
    }
    int ep[2];
    if (pipe2(ep, O_CLOEXEC)) _exit(127);
    pid_t cmd = vfork();
    if (cmd == 0) {
        setsid();
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(out_w, 1);
        dup2(err_w, 2);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int s = 1; s < 32; s++) if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
        envs[nenvs] = NULL;
        args[nargs] = NULL;
        execve(path, args, envs);
        int e = errno;
        if (write(ep[1], &e, sizeof e) < 0) {}
        _exit(127);
    }
    close(ep[1]);
    int e = 0;
    if (read(ep[0], &e, sizeof e) == sizeof e) {
        dprintf(res_w, "%s: %s", command, strerror(e));
        waitpid(cmd, NULL, 0);
        _exit(127);
    }
    close(out_w);
    close(err_w);
    close(res_w);
    if (read(ack_r, &c, 1) < 0) {}
    for (;;) {
        int stw;
        pid_t p = waitpid(-1, &stw, 0);
        if (p < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p == cmd) {
            int left = 0;
            DIR *d = opendir("/proc");
            struct dirent *de;
            while (d && (de = readdir(d)))
                if (de->d_name[0] >= '0' && de->d_name[0] <= '9' && strcmp(de->d_name, "1")) left++;
            if (d) closedir(d);
            dprintf(status_w, "%d %d\n", stw, left);
        }
    }
    _exit(0);
}

static void write_cg(const char *d, const char *file, const char *v) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", d, file);
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (write(fd, v, strlen(v)) < 0) {}
    close(fd);
}

static int cg_pids(pid_t *out, int max) {
    int n = 0;
    for (int i = 0; i < ncg; i++) {
        char p[4200], buf[65536];
        snprintf(p, sizeof p, "%s/cgroup.procs", cgdirs[i]);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0) continue;
        buf[r] = 0;
        for (char *s = strtok(buf, "\n"); s && n < max; s = strtok(NULL, "\n")) out[n++] = atoi(s);
    }
    return n;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (!strncmp(a, "--dir=", 6)) dir = a + 6;
        else if (!strncmp(a, "--cwd=", 6)) cwd = a + 6;
        else if (!strncmp(a, "--command=", 10)) command = a + 10;
        else if (!strncmp(a, "--arg=", 6)) args[nargs++] = a + 6;
        else if (!strncmp(a, "--env=", 6)) envs[nenvs++] = a + 6;
        else if (!strncmp(a, "--hide=", 7)) hides[nhides++] = a + 7;
        else if (!strncmp(a, "--expose=", 9)) exposes[nexposes++] = a + 9;
        else if (!strncmp(a, "--cg=", 5)) cgdirs[ncg++] = a + 5;
        else if (!strncmp(a, "--uid=", 6)) uid = atoi(a + 6);
        else if (!strncmp(a, "--gid=", 6)) gid = atoi(a + 6);
        else if (!strncmp(a, "--limits=", 9)) limits_json = a + 9;
        else if (!strncmp(a, "--cgroups=", 10)) cgroups_json = a + 10;
    }
    snprintf(state_dir, sizeof state_dir, "%s", dir);
    for (int k = 0; k < 3; k++) *strrchr(state_dir, '/') = 0;
    char sd[4200];
    snprintf(sd, sizeof sd, "%s/signal", dir);
    sigdir = sd;
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    create_time_self = create_time(getpid());
    char buf[16384];
    snprintf(buf, sizeof buf, "{\"shim_pid\": %d, \"shim_create_time\": %.2f}", getpid(), create_time_self);
    write_file("shim.json", buf, 0, 0);
    char lp[4200];
    snprintf(lp, sizeof lp, "%s/log.jsonl", dir);
    log_fd = open(lp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGUSR1);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    int outp[2], errp[2], gop[2], resp[2], stp[2], ackp[2];
    if (pipe(outp) || pipe(errp) || pipe(gop) || pipe2(resp, O_CLOEXEC) || pipe2(stp, O_CLOEXEC) ||
        pipe2(ackp, O_CLOEXEC))
        die_failed("pipes");
    if (unshare(CLONE_NEWPID)) die_failed("cannot create a PID namespace");
    pid_t init = fork();
    if (init == 0) {
        close(outp[0]); close(errp[0]); close(gop[1]); close(resp[0]); close(stp[0]); close(ackp[1]);
        close(sfd);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        pid1(gop[0], resp[1], stp[1], ackp[0], outp[1], errp[1]);
    }
    close(template_fd);
    close(stp[1]); close(ackp[0]); close(outp[1]); close(errp[1]); close(gop[0]); close(resp[1]);
    char ps[32];
    snprintf(ps, sizeof ps, "%d", init);
    for (int i = 0; i < ncg; i++) write_cg(cgdirs[i], "cgroup.procs", ps);
    if (write(gop[1], "x", 1) < 0) {}
    close(gop[1]);
    char err[4096];
    size_t el = 0;
    ssize_t r;
    while ((r = read(resp[0], err + el, sizeof err - 1 - el)) > 0) el += r;
    err[el] = 0;
    close(resp[0]);
    if (el) {
        close(ackp[1]);
        waitpid(init, NULL, 0);
        char msg[4200];
        if (!strncmp(err, "FAIL:", 5)) snprintf(msg, sizeof msg, "%s", err + 5);
        else snprintf(msg, sizeof msg, "cannot start the command: %s", err);
        die_failed(msg);
    }
    pid_t cmd = 0;
    for (int tries = 0; tries < 200 && !cmd; tries++) {
        char p[128], kids[4096];
        snprintf(p, sizeof p, "/proc/%d/task/%d/children", init, init);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, kids, sizeof kids - 1) : -1;
        if (fd >= 0) close(fd);
        if (n > 0) {
            kids[n] = 0;
            for (char *s = strtok(kids, " \n"); s && !cmd; s = strtok(NULL, " \n")) {
                char sp[128], st[4096];
                snprintf(sp, sizeof sp, "/proc/%s/status", s);
                int f2 = open(sp, O_RDONLY | O_CLOEXEC);
                ssize_t m = f2 >= 0 ? read(f2, st, sizeof st - 1) : -1;
                if (f2 >= 0) close(f2);
                if (m <= 0) continue;
                st[m] = 0;
                char *l = strstr(st, "NSpid:");
                if (!l) continue;
                char *e = strchr(l, '\n');
                if (e) *e = 0;
                char *last = strrchr(l, '\t');
                if (last && atoi(last + 1) == 2) cmd = atoi(s);
            }
        }
        if (!cmd) usleep(5000);
    }
    if (!cmd) { kill(init, SIGKILL); die_failed("cannot find the worker's main process in its PID namespace"); }
    if (write(ackp[1], "x", 1) < 0) {}
    close(ackp[1]);
    double ctime_cmd = create_time(cmd), started_at = now();
    snprintf(buf, sizeof buf,
             "{\"pid\": %d, \"pid_create_time\": %.2f, \"pgid\": %d, \"shim_pid\": %d, \"shim_create_time\": %.2f, "
             "\"started_at\": %.6f, \"cgroup\": %s%s%s, \"cgroups\": %s, \"limits\": %s}",
             cmd, ctime_cmd, cmd, getpid(), create_time_self, started_at, ncg ? "\"" : "", ncg ? cgdirs[0] : "null",
             ncg ? "\"" : "", cgroups_json ? cgroups_json : "null", limits_json ? limits_json : "null");
    write_file("started.json", buf, 1, 0);
    int status = -1, have = 0, open_streams = 2, stop = 0;
    double finished_at = 0, drain_until = 0, deadline = 0;
    struct pollfd pf[4] = {{outp[0], POLLIN, 0}, {errp[0], POLLIN, 0}, {stp[0], POLLIN, 0}, {sfd, POLLIN, 0}};
    for (;;) {
        int timeout = 250;
        if (poll(pf, 4, timeout) < 0 && errno != EINTR) break;
        double t = now();
        for (int i = 0; i < 2; i++) {
            if (pf[i].fd >= 0 && pf[i].revents) {
                char chunk[65536];
                ssize_t n = read(pf[i].fd, chunk, sizeof chunk);
                if (n > 0) feed(i, chunk, n, t);
                else if (n == 0 || errno != EAGAIN) {
                    if (plen[i]) { emit(i, partial[i], plen[i], t); plen[i] = 0; }
                    close(pf[i].fd);
                    pf[i].fd = -1;
                    open_streams--;
                }
            }
        }
        if (pf[2].fd >= 0 && pf[2].revents) {
            char sb[256];
            ssize_t n = read(pf[2].fd, sb, sizeof sb - 1);
            if (n > 0) {
                sb[n] = 0;
                if (!have) { status = atoi(sb); have = 1; finished_at = now(); }
            } else { close(pf[2].fd); pf[2].fd = -1; }
        }
        if (pf[3].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == sizeof si) {
                if ((si.ssi_signo == SIGTERM || si.ssi_signo == SIGUSR1) && !stop) {
                    stop = 1;
                    deadline = t + 2;
                    kill(cmd, SIGTERM);
                }
            }
        }
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, WNOHANG)) > 0)
            if (p == init && !have) { status = st; have = 1; finished_at = now(); }
        if (stop && !have && t >= deadline) {
            for (int i = 0; i < ncg; i++) write_cg(cgdirs[i], "cgroup.kill", "1");
            kill(init, SIGKILL);
        }
        if (!have) continue;
        pid_t left[1024];
        int nl = cg_pids(left, 1024);
        if (nl) {
            for (int i = 0; i < nl; i++) kill(left[i], SIGKILL);
            usleep(20000);
            continue;
        }
        if (!drain_until) drain_until = t + 1.0;
        if (!open_streams || t >= drain_until) break;
    }
    for (int tries = 0; tries < 50; tries++) {
        int still = 0;
        for (int i = 0; i < ncg; i++) if (rmdir(cgdirs[i]) && errno != ENOENT) still++;
        if (!still) break;
        usleep(20000);
    }
    char ec[32] = "null", sg[32] = "null";
    if (WIFSIGNALED(status)) snprintf(sg, sizeof sg, "%d", WTERMSIG(status));
    else snprintf(ec, sizeof ec, "%d", WEXITSTATUS(status));
    snprintf(buf, sizeof buf,
             "{\"exit_code\": %s, \"signal\": %s, \"killed\": false, \"finished_at\": %.6f, \"stop_requested\": %s, "
             "\"message\": null, \"oom\": false, \"oom_limit_bytes\": null}",
             ec, sg, finished_at, stop ? "true" : "false");
    write_file("exit.json", buf, 1, 1);
    return 0;
}
