// Images for the chat composer: what may be attached (the API node's own bounds, checked
// here first so a refusal is immediate), the full image as a data URL for the request, and
// a small JPEG thumbnail for the kept history (localStorage holds thumbnails only).

export const MAX_IMAGES = 16; // skulk.api.media.MAX_IMAGES_PER_REQUEST
export const MAX_IMAGE_BYTES = 20 * 1024 * 1024; // skulk.api.media.MAX_IMAGE_BYTES
export const THUMB_PX = 160; // the longer side of a kept thumbnail (a few KB as JPEG)
const TYPES = new Set(["image/png", "image/jpeg", "image/webp", "image/gif"]);

// Why `file` cannot be attached beside `count` others, or null.
export function attachable(file, count) {
  if (!TYPES.has(file.type)) return `${file.name}: only PNG, JPEG, WebP and GIF images can be sent.`;
  if (file.size > MAX_IMAGE_BYTES) return `${file.name}: larger than ${MAX_IMAGE_BYTES / 1048576} MiB.`;
  if (count >= MAX_IMAGES) return `At most ${MAX_IMAGES} images per message.`;
  return null;
}

function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error("could not be read"));
    reader.readAsDataURL(file);
  });
}

async function thumbnail(url) {
  const image = new Image();
  image.src = url;
  await image.decode().catch(() => { throw new Error("is not an image this browser can show"); });
  const scale = Math.min(1, THUMB_PX / Math.max(image.naturalWidth, image.naturalHeight));
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, Math.round(image.naturalWidth * scale));
  canvas.height = Math.max(1, Math.round(image.naturalHeight * scale));
  canvas.getContext("2d").drawImage(image, 0, 0, canvas.width, canvas.height);
  return canvas.toDataURL("image/jpeg", 0.7);
}

// { name, url: the full image as a data: URL, thumb: a small JPEG data: URL }
export async function readImage(file) {
  const url = await dataUrl(file);
  return { name: file.name, url, thumb: await thumbnail(url) };
}
