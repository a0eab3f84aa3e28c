// Exploration: can chunked DMAs through a device staging ring, fed by a
// device-side gather/scatter, reach the large copies' duplex rate?
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <chrono>
#include <random>
#include <cuda_runtime.h>
#define CK(x) do{cudaError_t e=(x); if(e!=cudaSuccess){printf("%s:%d %s\n",__FILE__,__LINE__,cudaGetErrorString(e));exit(1);}}while(0)
typedef unsigned long long u64;
struct Piece{u64 dst,src; long long bytes;};
__global__ void copyk(const Piece* p, unsigned n){
  for(unsigned i=blockIdx.x;i<n;i+=gridDim.x){
    Piece q=p[i]; uint4* d=(uint4*)q.dst; const uint4* s=(const uint4*)q.src; long long m=q.bytes/16;
    for(long long j=threadIdx.x;j<m;j+=blockDim.x*4){
      uint4 a[4]; int c=0;
      for(int u=0;u<4;u++){ long long k=j+u*blockDim.x; if(k<m){a[u]=s[k];c=u+1;} }
      for(int u=0;u<c;u++){ long long k=j+u*blockDim.x; d[k]=a[u]; }
    }
  }
}
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
const size_t G=1ull<<30;
char *hostA,*hostB; char *gpu; char *gpuA,*gpuB; 
cudaStream_t dUp,dDn,sUp,sDn;
double med(std::vector<double> v){std::sort(v.begin(),v.end());return v[v.size()/2];}
void sync(){CK(cudaStreamSynchronize(dUp));CK(cudaStreamSynchronize(dDn));CK(cudaStreamSynchronize(sUp));CK(cudaStreamSynchronize(sDn));}
double large(bool up,bool dn){double t=now(); if(up)CK(cudaMemcpyAsync(gpuA,hostA,G,cudaMemcpyHostToDevice,dUp)); if(dn)CK(cudaMemcpyAsync(hostB,gpuB,G,cudaMemcpyDeviceToHost,dDn)); sync(); return now()-t;}
double chunked(size_t C,bool up,bool dn){double t=now(); for(size_t o=0;o<G;o+=C){ if(up)CK(cudaMemcpyAsync(gpuA+o,hostA+o,C,cudaMemcpyHostToDevice,dUp)); if(dn)CK(cudaMemcpyAsync(hostB+o,gpuB+o,C,cudaMemcpyDeviceToHost,dDn));} sync(); return now()-t;}
struct Pipe{ size_t C; int R; std::vector<char*> st; std::vector<cudaEvent_t> filled,freed; std::vector<bool> used; Piece* dpieces; int ctas,thr;};
// pieces for each chunk precomputed on device: for onboard scatter: dst=gpu block, src=staging; for gather: dst=staging, src=gpu block
std::vector<u64> permA,permB; // block offsets
double pipeline(size_t bs,size_t C,int R,int ctas,int thr,bool up,bool dn, int mode /*0 both ways pipelined*/){
  static Piece* dp=nullptr; static size_t dpn=0; size_t nb=G/bs; size_t per=C/bs; size_t nch=G/C;
  // build pieces: [0,nb) onboard, [nb,2nb) offload, per chunk staging index assigned at run
  std::vector<char*> stU(R),stD(R); std::vector<cudaEvent_t> fU(R),rU(R),fD(R),rD(R);
  for(int i=0;i<R;i++){CK(cudaMalloc(&stU[i],C));CK(cudaMalloc(&stD[i],C));CK(cudaEventCreateWithFlags(&fU[i],cudaEventDisableTiming));CK(cudaEventCreateWithFlags(&rU[i],cudaEventDisableTiming));CK(cudaEventCreateWithFlags(&fD[i],cudaEventDisableTiming));CK(cudaEventCreateWithFlags(&rD[i],cudaEventDisableTiming));}
  size_t sp=bs<(64u<<10)?bs:(64u<<10), q=bs/sp; // sub-pieces per block
  std::vector<Piece> hp(2*nb*q);
  for(size_t k=0;k<nch;k++) for(size_t j=0;j<per;j++) for(size_t u=0;u<q;u++){ size_t i=k*per+j; int b=k%R; size_t x=i*q+u;
    hp[x]={(u64)(gpuA+permA[i]*bs+u*sp),(u64)(stU[b]+j*bs+u*sp),(long long)sp};
    hp[nb*q+x]={(u64)(stD[b]+j*bs+u*sp),(u64)(gpuB+permB[i]*bs+u*sp),(long long)sp}; }
  nb*=q; per*=q;
  if(dpn<2*nb){ if(dp)cudaFree(dp); CK(cudaMalloc(&dp,2*nb*sizeof(Piece))); dpn=2*nb;}
  CK(cudaMemcpy(dp,hp.data(),2*nb*sizeof(Piece),cudaMemcpyHostToDevice));
  sync(); double t=now();
  for(size_t k=0;k<nch;k++){ int b=k%R; bool reuse=k>=(size_t)R;
    if(up){ if(reuse)CK(cudaStreamWaitEvent(dUp,rU[b],0)); CK(cudaMemcpyAsync(stU[b],hostA+k*C,C,cudaMemcpyHostToDevice,dUp)); CK(cudaEventRecord(fU[b],dUp));
      CK(cudaStreamWaitEvent(sUp,fU[b],0)); copyk<<<ctas,thr,0,sUp>>>(dp+k*per,per); CK(cudaEventRecord(rU[b],sUp)); }
    if(dn){ if(reuse)CK(cudaStreamWaitEvent(sDn,rD[b],0)); copyk<<<ctas,thr,0,sDn>>>(dp+nb+k*per,per); CK(cudaEventRecord(fD[b],sDn));
      CK(cudaStreamWaitEvent(dDn,fD[b],0)); CK(cudaMemcpyAsync(hostB+k*C,stD[b],C,cudaMemcpyDeviceToHost,dDn)); CK(cudaEventRecord(rD[b],dDn)); }
  }
  sync(); double el=now()-t;
  for(int i=0;i<R;i++){cudaFree(stU[i]);cudaFree(stD[i]);cudaEventDestroy(fU[i]);cudaEventDestroy(rU[i]);cudaEventDestroy(fD[i]);cudaEventDestroy(rD[i]);}
  return el;
}
double twod(size_t row,size_t pitch,size_t C,bool up,bool dn){ // host rows strided by pitch, device contiguous
  size_t rows=C/row; size_t span=rows*pitch; double t=now();
  for(size_t o=0;o<G;o+=C){ size_t k=(o/C)%(G/span>0?G/span:1); 
    if(up)CK(cudaMemcpy2DAsync(gpuA+o,row,hostA+k*span,pitch,row,rows,cudaMemcpyHostToDevice,dUp));
    if(dn)CK(cudaMemcpy2DAsync(hostB+k*span,pitch,gpuB+o,row,row,rows,cudaMemcpyDeviceToHost,dDn)); }
  sync(); return now()-t;}
int main(){
  CK(cudaHostAlloc(&hostA,G,0));CK(cudaHostAlloc(&hostB,G,0)); memset(hostA,1,G); memset(hostB,2,G);
  CK(cudaMalloc(&gpu,8*G)); gpuA=gpu; gpuB=gpu+4*G;
  int lo,hi; CK(cudaDeviceGetStreamPriorityRange(&lo,&hi));
  CK(cudaStreamCreateWithPriority(&dUp,cudaStreamNonBlocking,hi));CK(cudaStreamCreateWithPriority(&dDn,cudaStreamNonBlocking,0));
  CK(cudaStreamCreateWithPriority(&sUp,cudaStreamNonBlocking,hi));CK(cudaStreamCreateWithPriority(&sDn,cudaStreamNonBlocking,0));
  int rounds=5;
  auto rep=[&](const char* name,double bytes,auto fn){ fn(); std::vector<double> v; for(int r=0;r<rounds;r++) v.push_back(bytes/fn()/(1<<30)); std::sort(v.begin(),v.end()); printf("%-60s %7.1f GiB/s (min %.1f max %.1f)\n",name,v[v.size()/2],v[0],v.back()); fflush(stdout);};
  rep("large both",2.0*G,[&]{return large(1,1);});
  rep("large up",1.0*G,[&]{return large(1,0);});
  rep("large down",1.0*G,[&]{return large(0,1);});
  for(size_t C: {1ull<<20,4ull<<20,16ull<<20,64ull<<20}){ char n[100]; sprintf(n,"chunked DMA both C=%zuMiB",C>>20); rep(n,2.0*G,[&]{return chunked(C,1,1);}); }
  for(size_t bs: {16ull<<10,64ull<<10,256ull<<10,2ull<<20}){
    size_t nb=G/bs, slots=4*G/bs; std::mt19937_64 rng(bs); std::vector<u64> p(slots); for(size_t i=0;i<slots;i++)p[i]=i;
    std::shuffle(p.begin(),p.end(),rng); permA.assign(p.begin(),p.begin()+nb); std::shuffle(p.begin(),p.end(),rng); permB.assign(p.begin(),p.begin()+nb);
    for(size_t C: {4ull<<20,16ull<<20,64ull<<20}) for(int R: {2,3}) for(int cfg=0;cfg<2;cfg++){ int ctas=cfg?132:32, thr=cfg?512:128;
      char n[160]; sprintf(n,"pipe bs=%zuK C=%zuMiB R=%d %dx%d both",bs>>10,C>>20,R,ctas,thr); rep(n,2.0*G,[&]{return pipeline(bs,C,R,ctas,thr,1,1,0);});
      if(C==16ull<<20 && R==2){ sprintf(n,"pipe bs=%zuK C=%zuMiB R=%d %dx%d up",bs>>10,C>>20,R,ctas,thr); rep(n,1.0*G,[&]{return pipeline(bs,C,R,ctas,thr,1,0,0);});
        sprintf(n,"pipe bs=%zuK C=%zuMiB R=%d %dx%d down",bs>>10,C>>20,R,ctas,thr); rep(n,1.0*G,[&]{return pipeline(bs,C,R,ctas,thr,0,1,0);}); }
    }
  }
  for(size_t row: {16ull<<10,64ull<<10}) for(size_t C: {4ull<<20,16ull<<20}){ size_t pitch=row*32; char n[120];
    sprintf(n,"2D row=%zuK pitch=%zuK C=%zuMiB both",row>>10,pitch>>10,C>>20); rep(n,2.0*G,[&]{return twod(row,pitch,C,1,1);});
    sprintf(n,"2D row=%zuK pitch=%zuK C=%zuMiB up",row>>10,pitch>>10,C>>20); rep(n,1.0*G,[&]{return twod(row,pitch,C,1,0);});
    sprintf(n,"2D row=%zuK pitch=%zuK C=%zuMiB down",row>>10,pitch>>10,C>>20); rep(n,1.0*G,[&]{return twod(row,pitch,C,0,1);}); }
  return 0;
}
