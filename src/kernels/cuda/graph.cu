/*
 * graph: recording the ops of a decode step into a CUDA graph and replaying
 * it (backend.h graph_*, ADR 0024).
 *
 * graph_begin puts the backend's one stream into capture mode (thread-local:
 * another thread's CUDA calls are not disturbed); the ops that follow are
 * recorded as graph nodes instead of running. graph_end ends the capture and
 * instantiates the graph, or throws the recording away when an op could not
 * be recorded (cu_not_capturable: downloads, scratch, host round trips) or
 * failed; then the error it recorded is cleared, since nothing ran and the
 * caller runs the same ops again directly, where any real failure recurs.
 * graph_launch replays an instantiated graph on the stream: one launch for
 * the ~250 kernels of a step, with no host work per kernel.
 */
#include "cuda_impl.h"

void cu_graph_begin(struct backend *be)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || c->capturing)
        return;
    cudaError_t rc = cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal);
    if (rc != cudaSuccess) {
        cu_fail(c, "graph capture", rc);
        return;
    }
    c->capturing = true;
    c->cap_bad = false;
}

void *cu_graph_end(struct backend *be)
{
    struct cuda_backend *c = cu_of(be);
    if (!c->capturing)
        return NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaError_t rc = cudaStreamEndCapture(c->st, &g);
    c->capturing = false;
    bool ok = rc == cudaSuccess && g && !c->cap_bad && !c->err_rc;
    if (ok && cudaGraphInstantiate(&x, g, 0) != cudaSuccess)
        x = NULL;
    if (g)
        cudaGraphDestroy(g);
    if (!x) {
        /* nothing ran: forget what the recording recorded, the caller reruns the ops */
        cudaGetLastError();
        c->err_rc = 0;
        c->err_msg[0] = '\0';
    }
    c->cap_bad = false;
    return x;
}

void cu_graph_launch(struct backend *be, void *graph)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || !graph)
        return;
    cudaError_t rc = cudaGraphLaunch((cudaGraphExec_t)graph, c->st);
    if (rc != cudaSuccess)
        cu_fail(c, "graph launch", rc);
}

void cu_graph_free(struct backend *be, void *graph)
{
    (void)be;
    if (graph)
        cudaGraphExecDestroy((cudaGraphExec_t)graph);
}
